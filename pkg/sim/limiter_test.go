package sim

import (
	"math/rand/v2"
	"testing"
	"time"
)

// arrival is one charge as a brute-force model of the provider sees it.
type arrival struct {
	at       int64
	admitted bool
	cost     int64
}

// bruteSums sums the arrivals in (t-span, t]: all requests, admitted ones,
// tokens.
func bruteSums(log []arrival, t, span int64) (reqs, adm, tok int64) {
	for j := len(log) - 1; j >= 0 && log[j].at > t-span; j-- {
		if log[j].at > t {
			continue
		}
		reqs++
		if log[j].admitted {
			adm++
			tok += log[j].cost
		}
	}
	return reqs, adm, tok
}

// bruteFits reports whether a request costing cost fits at t, straight from
// the documented rules.
func bruteFits(l limits, log []arrival, t, cost int64) bool {
	r60, _, t60 := bruteSums(log, t, int64(time.Minute))
	r1, _, t1 := bruteSums(log, t, int64(time.Second))
	switch {
	case l.rpm > 0 && r60+1 > l.rpm:
	case l.burstReqs > 0 && r1+1 > l.burstReqs:
	case l.tpm > 0 && t60+cost > l.tpm:
	case l.burstToks > 0 && t1 > 0 && t1+cost > l.burstToks:
	default:
		return true
	}
	return false
}

// TestAdmissionMatchesBruteForce drives one limiter with a random workload
// and checks every decision, every Retry-After and the window peaks against
// a brute-force reading of the rules.
func TestAdmissionMatchesBruteForce(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	l := newLimits(ModelLimits{Name: "m", RPM: 50, TPM: 20_000}, 0.1) // bursts: 5 requests, 2000 tokens
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	m := &modelState{lim: l, start: start}
	var log []arrival
	now := start
	var peakR, peakA, peakT, peakR1, peakA1, peakT1 int64
	for i := range 8000 {
		switch p := rng.IntN(10); {
		case p < 2: // same instant
		case p < 5:
			now += rng.Int64N(int64(time.Second))
		default:
			now += rng.Int64N(int64(5 * time.Second))
		}
		cost := 1 + rng.Int64N(1500)
		switch rng.IntN(50) {
		case 0:
			cost = 2500 // above the burst cap: only alone in its second
		case 1:
			cost = 25_000 // above TPM: never
		}
		want := bruteFits(l, log, now, cost) && cost <= l.tpm
		d := m.admit(now, cost)
		if d.admitted != want {
			t.Fatalf("arrival %d at +%v cost %d: admitted=%v, brute force says %v", i, time.Duration(now-start), cost, d.admitted, want)
		}
		log = append(log, arrival{at: now, admitted: d.admitted, cost: cost})
		checkRetry(t, l, log, d, cost)

		r, a, tk := bruteSums(log, now, int64(time.Minute))
		peakR, peakA, peakT = max(peakR, r), max(peakA, a), max(peakT, tk)
		r, a, tk = bruteSums(log, now, int64(time.Second))
		peakR1, peakA1, peakT1 = max(peakR1, r), max(peakA1, a), max(peakT1, tk)
	}
	ms := m.snapshot(now)
	got := [6]int{ms.MaxRequestsIn60s, ms.MaxAdmittedRequestsIn60s, ms.MaxTokensIn60s, ms.MaxRequestsIn1s, ms.MaxAdmittedRequestsIn1s, ms.MaxTokensIn1s}
	want := [6]int{int(peakR), int(peakA), int(peakT), int(peakR1), int(peakA1), int(peakT1)}
	if got != want {
		t.Fatalf("peaks = %v, brute force %v", got, want)
	}
	if peakA > l.rpm || peakT > l.tpm || peakA1 > l.burstReqs {
		t.Fatalf("over-admission: peaks %v with limits %+v", want, l)
	}
	t.Logf("admitted %d, rejected %d, events kept %d, peaks %v", ms.Admitted, ms.RateLimited, len(m.log.ev), want)
	if ms.RateLimited == 0 || ms.Admitted == 0 || len(m.log.ev) > 2*compactAt+1000 {
		t.Fatalf("workload did not exercise the limiter: %+v, %d events kept", ms.Requests, len(m.log.ev))
	}
}

// checkRetry checks that a rejected request fits exactly d.retry later (and
// not a nanosecond earlier), counting its own rejection.
func checkRetry(t *testing.T, l limits, log []arrival, d decision, cost int64) {
	t.Helper()
	if d.admitted {
		return
	}
	if d.tooLarge {
		if d.retry != 0 || d.reason != tpmMinute {
			t.Fatalf("too large: retry %v reason %v", d.retry, d.reason)
		}
		return
	}
	if d.retry <= 0 {
		t.Fatalf("rejected with retry %v", d.retry)
	}
	at := d.at + int64(d.retry)
	if !bruteFits(l, log, at, cost) {
		t.Fatalf("rejected at %d: does not fit after retry %v", d.at, d.retry)
	}
	if bruteFits(l, log, at-1, cost) {
		t.Fatalf("rejected at %d: already fits before retry %v", d.at, d.retry)
	}
}

func TestClockSteppingBackIsClamped(t *testing.T) {
	t.Parallel()
	m := &modelState{lim: newLimits(ModelLimits{Name: "m", RPM: 2}, 1)}
	base := int64(100 * time.Second)
	if d := m.admit(base, 1); !d.admitted {
		t.Fatal("first rejected")
	}
	d := m.admit(base-int64(30*time.Second), 1)
	if !d.admitted || d.at != base {
		t.Fatalf("step back: admitted=%v at=%d, want at=%d", d.admitted, d.at, base)
	}
	if d := m.admit(base+int64(59*time.Second), 1); d.admitted || d.retry != time.Second {
		t.Fatalf("third: admitted=%v retry=%v, want rejected for 1s", d.admitted, d.retry)
	}
}

func TestBurstCapRounding(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit    int
		fraction float64
		want     int64
	}{{0, 0.1, 0}, {600, 0.1, 60}, {3, 0.1, 1}, {10, 0.05, 1}, {101, 0.1, 11}, {7, 1, 7}} {
		if got := burstCap(tc.limit, tc.fraction); got != tc.want {
			t.Errorf("burstCap(%d, %g) = %d, want %d", tc.limit, tc.fraction, got, tc.want)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                         "0s",
		time.Second:               "1s",
		6 * time.Minute:           "6m0s",
		120 * time.Millisecond:    "120ms",
		1200 * time.Millisecond:   "1.2s",
		time.Microsecond:          "1ms",
		1500*time.Microsecond + 1: "2ms",
	} {
		if got := formatDuration(d); got != want {
			t.Errorf("formatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestHashedOutputTokens(t *testing.T) {
	t.Parallel()
	for _, maxTok := range []int{1, 2, 3, 4, 7, 256, 4096} {
		for i := range 50 {
			body := []byte{byte(i), byte(maxTok)}
			n := hashedOutputTokens(maxTok, body)
			if n < max(maxTok/4, 1) || n > max(maxTok/2, 1) || n != hashedOutputTokens(maxTok, body) {
				t.Fatalf("hashedOutputTokens(%d) = %d", maxTok, n)
			}
		}
	}
}

func TestFaultRollRates(t *testing.T) {
	t.Parallel()
	f := Faults{Seed: 42, Rate500: 0.1, Rate502: 0.05, Rate503: 0.2, RateReset: 0.01, RateHang: 0.02}
	got := map[fault]int{}
	const n = 100_000
	for i := range uint64(n) {
		got[f.roll(i+1)]++
	}
	for fl, rate := range map[fault]float64{fault500: 0.1, fault502: 0.05, fault503: 0.2, faultReset: 0.01, faultHang: 0.02, noFault: 0.62} {
		if frac := float64(got[fl]) / n; frac < rate*0.9 || frac > rate*1.1 {
			t.Errorf("fault %d: rate %.4f, want about %g", fl, frac, rate)
		}
	}
}
