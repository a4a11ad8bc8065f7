package sim

import (
	"math/big"
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

// brute is a model of one profile written straight from the documented
// rules, with its numbers worked out by hand.
type brute struct {
	rpm, tpm int64
	// A short window: span, caps on all requests and on tokens (0 = none).
	span                 int64
	shortReqs, shortToks int64
	// Buckets: capacity in tokens (or requests); refill is limit/60 per
	// second, counted at whole milliseconds.
	bucketReqs, bucketToks *big.Rat
	// The acceleration ramp (growth 0 = none).
	floorReqs, floorToks int64
	growth               int64
}

// bucketState is a bucket as of the last admitted arrival: its level in
// requests or tokens and the millisecond it was taken at.
type bucketState struct {
	level *big.Rat
	ms    int64
}

// bruteBuckets replays the admitted arrivals of log through fresh buckets
// started full at start.
func (b brute) bruteBuckets(log []arrival, start int64) (reqs, toks bucketState) {
	reqs = bucketState{new(big.Rat).Set(b.bucketReqs), start / int64(time.Millisecond)}
	toks = bucketState{new(big.Rat).Set(b.bucketToks), reqs.ms}
	for _, a := range log {
		if !a.admitted {
			continue
		}
		reqs = b.drain(reqs, b.rpm, b.bucketReqs, a.at, 1)
		toks = b.drain(toks, b.tpm, b.bucketToks, a.at, a.cost)
	}
	return reqs, toks
}

// level is what a bucket of limit and capacity holds at t.
func (b brute) level(s bucketState, limit int64, capacity *big.Rat, t int64) *big.Rat {
	ms := t / int64(time.Millisecond)
	l := new(big.Rat).Add(s.level, big.NewRat(limit*(ms-s.ms), 60_000))
	if l.Cmp(capacity) > 0 {
		l.Set(capacity)
	}
	return l
}

func (b brute) drain(s bucketState, limit int64, capacity *big.Rat, t, n int64) bucketState {
	l := b.level(s, limit, capacity, t)
	l.Sub(l, big.NewRat(n, 1))
	if l.Sign() < 0 {
		l.SetInt64(0)
	}
	return bucketState{l, t / int64(time.Millisecond)}
}

// fits reports whether a request costing cost fits at t after log, whose
// buckets stand at bk (as of the newest admitted arrival, at or before t).
func (b brute) fits(log []arrival, bk [2]bucketState, t, cost int64) bool {
	if b.tpm > 0 && cost > b.tpm {
		return false
	}
	r60, _, t60 := bruteSums(log, t, int64(time.Minute))
	if (b.rpm > 0 && r60+1 > b.rpm) || (b.tpm > 0 && t60+cost > b.tpm) {
		return false
	}
	if b.span > 0 {
		r, _, tk := bruteSums(log, t, b.span)
		if r+1 > b.shortReqs || (tk > 0 && tk+cost > b.shortToks) {
			return false
		}
	}
	if b.bucketReqs != nil {
		for i, need := range []int64{1, cost} {
			limit, capacity := b.rpm, b.bucketReqs
			if i == 1 {
				limit, capacity = b.tpm, b.bucketToks
			}
			l := b.level(bk[i], limit, capacity, t)
			if n := big.NewRat(need, 1); n.Cmp(capacity) > 0 {
				if l.Cmp(capacity) != 0 {
					return false
				}
			} else if l.Cmp(n) < 0 {
				return false
			}
		}
	}
	if b.growth > 0 {
		_, a10, t10 := bruteSums(log, t, int64(10*time.Second))
		_, a20, t20 := bruteSums(log, t, int64(20*time.Second))
		if a10 > 0 && a10+1 > max(b.floorReqs, b.growth*(a20-a10)) {
			return false
		}
		if t10 > 0 && t10+cost > max(b.floorToks, b.growth*(t20-t10)) {
			return false
		}
	}
	return true
}

// TestAdmissionMatchesBruteForce drives one limiter per profile with a
// random workload and checks every decision, every Retry-After and the
// window peaks against a brute-force reading of the rules.
func TestAdmissionMatchesBruteForce(t *testing.T) {
	t.Parallel()
	sec := int64(time.Second)
	for _, tc := range []struct {
		name  string
		cfg   Config
		model brute
		// reasons that the workload must have hit
		reasons []string
	}{
		{"quantized", Config{}, brute{rpm: 120, tpm: 60_000, span: sec, shortReqs: 2, shortToks: 1000},
			[]string{"requests_short_window", "tokens_short_window"}},
		{"quantized, fraction 0.1", Config{BurstFraction: 0.1}, brute{rpm: 60, tpm: 30_000, span: sec, shortReqs: 6, shortToks: 3000},
			[]string{"requests_per_minute", "tokens_per_minute"}},
		{"hidden", Config{Profile: ProfileHidden}, brute{rpm: 120, tpm: 60_000, span: sec, shortReqs: 2, shortToks: 1000},
			[]string{"requests_short_window", "tokens_short_window"}},
		{"azure", Config{Profile: ProfileAzure}, brute{rpm: 120, tpm: 60_000, span: 10 * sec, shortReqs: 20, shortToks: 10_000},
			[]string{"requests_short_window", "tokens_short_window"}},
		{"token bucket", Config{Profile: ProfileTokenBucket},
			brute{rpm: 90, tpm: 50_000, bucketReqs: big.NewRat(3, 2), bucketToks: big.NewRat(2500, 3)},
			[]string{"requests_bucket", "tokens_bucket"}},
		{"token bucket, 2.5 s", Config{Profile: ProfileTokenBucket, BucketSeconds: 2.5},
			brute{rpm: 120, tpm: 60_000, bucketReqs: big.NewRat(5, 1), bucketToks: big.NewRat(2500, 1)},
			[]string{"requests_bucket", "tokens_bucket"}},
		{"acceleration", Config{Profile: ProfileAcceleration},
			brute{rpm: 120, tpm: 60_000, span: sec, shortReqs: 2, shortToks: 1000, floorReqs: 5, floorToks: 2500, growth: 2},
			[]string{"requests_short_window", "tokens_short_window", "requests_acceleration", "tokens_acceleration"}},
		{"acceleration, floor 1, growth 3", Config{Profile: ProfileAcceleration, AccelFloor: 1, AccelGrowth: 3, BurstFraction: 0.5},
			brute{rpm: 120, tpm: 60_000, span: sec, shortReqs: 60, shortToks: 30_000, floorReqs: 20, floorToks: 10_000, growth: 3},
			[]string{"requests_acceleration", "tokens_acceleration"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.cfg
			cfg.Models = []ModelLimits{{Name: "m", RPM: int(tc.model.rpm), TPM: int(tc.model.tpm)}}
			cfg, err := cfg.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			checkBruteForce(t, newLimits(cfg.Models[0], cfg), tc.model, tc.reasons)
		})
	}
}

func checkBruteForce(t *testing.T, l limits, b brute, reasons []string) {
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	m := newModelState(l, start)
	var log []arrival
	bk := [2]bucketState{}
	if b.bucketReqs != nil {
		bk[0], bk[1] = b.bruteBuckets(nil, start)
	}
	now := start
	var peaks [9]int64 // 60 s, 1 s, short: requests, admitted, tokens
	for i := range 8000 {
		switch p := rng.IntN(100); {
		case p < 30: // same instant
		case p < 75:
			now += rng.Int64N(int64(time.Second))
		case p < 98:
			now += rng.Int64N(int64(4 * time.Second))
		default: // idle, for the ramp to start over
			now += int64(10*time.Second) + rng.Int64N(int64(30*time.Second))
		}
		cost := 1 + rng.Int64N(1500)
		switch rng.IntN(50) {
		case 0:
			cost = 4000 // above most short caps and ramp floors: only alone in its window
		case 1:
			cost = 75_000 // above TPM: never
		}
		want := b.fits(log, bk, now, cost)
		d := m.admit(now, cost)
		if d.admitted != want {
			t.Fatalf("arrival %d at +%v cost %d: admitted=%v, brute force says %v", i, time.Duration(now-start), cost, d.admitted, want)
		}
		log = append(log, arrival{at: now, admitted: d.admitted, cost: cost})
		if d.admitted && b.bucketReqs != nil {
			bk[0] = b.drain(bk[0], b.rpm, b.bucketReqs, now, 1)
			bk[1] = b.drain(bk[1], b.tpm, b.bucketToks, now, cost)
		}
		checkRetry(t, b, log, bk, d, cost)

		for w, span := range []int64{int64(time.Minute), int64(time.Second), max(b.span, int64(time.Second))} {
			r, a, tk := bruteSums(log, now, span)
			peaks[3*w], peaks[3*w+1], peaks[3*w+2] = max(peaks[3*w], r), max(peaks[3*w+1], a), max(peaks[3*w+2], tk)
		}
	}
	ms := m.snapshot(now)
	got := [6]int{ms.MaxRequestsIn60s, ms.MaxAdmittedRequestsIn60s, ms.MaxTokensIn60s, ms.MaxRequestsIn1s, ms.MaxAdmittedRequestsIn1s, ms.MaxTokensIn1s}
	want := [6]int{int(peaks[0]), int(peaks[1]), int(peaks[2]), int(peaks[3]), int(peaks[4]), int(peaks[5])}
	if got != want {
		t.Fatalf("peaks = %v, brute force %v", got, want)
	}
	if b.span > int64(time.Second) {
		short := [3]int{ms.MaxRequestsInShort, ms.MaxAdmittedRequestsInShort, ms.MaxTokensInShort}
		if want := [3]int{int(peaks[6]), int(peaks[7]), int(peaks[8])}; short != want {
			t.Fatalf("short-window peaks = %v, brute force %v", short, want)
		}
	}
	if peaks[1] > b.rpm || peaks[2] > b.tpm || (b.span > 0 && peaks[7] > b.shortReqs) {
		t.Fatalf("over-admission: peaks %v with %+v", peaks, b)
	}
	t.Logf("admitted %d, rejected %d %v, events kept %d, peaks %v", ms.Admitted, ms.RateLimited, ms.RateLimitedBy, len(m.log.ev), peaks)
	if ms.RateLimited == 0 || ms.Admitted == 0 || len(m.log.ev) > 2*compactAt+1000 {
		t.Fatalf("workload did not exercise the limiter: %+v, %d events kept", ms, len(m.log.ev))
	}
	for _, r := range reasons {
		if ms.RateLimitedBy[r] == 0 {
			t.Errorf("no rejection by %s: %v", r, ms.RateLimitedBy)
		}
	}
}

// checkRetry checks that a rejected request fits exactly d.retry later,
// counting its own rejection, and at no earlier instant.
func checkRetry(t *testing.T, b brute, log []arrival, bk [2]bucketState, d decision, cost int64) {
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
	if !b.fits(log, bk, at, cost) {
		t.Fatalf("rejected at %d: does not fit after retry %v", d.at, d.retry)
	}
	if b.fits(log, bk, at-1, cost) {
		t.Fatalf("rejected at %d: already fits before retry %v", d.at, d.retry)
	}
	if b.growth == 0 {
		return // every other limit, once it fits, keeps fitting
	}
	// The ramp can open and close again: it changes only when an admitted
	// charge e crosses e+10s or e+20s, and everything else only opens
	// with time, so any earlier fit would show just before such a change.
	for j := len(log) - 1; j >= 0 && log[j].at > d.at-int64(20*time.Second); j-- {
		a := log[j]
		for _, c := range []int64{a.at + int64(10*time.Second), a.at + int64(20*time.Second)} {
			if a.admitted && c > d.at && c < at && b.fits(log, bk, c-1, cost) {
				t.Fatalf("rejected at %d: fits at +%v, before retry %v", d.at, time.Duration(c-1-d.at), d.retry)
			}
		}
	}
}

func TestClockSteppingBackIsClamped(t *testing.T) {
	t.Parallel()
	m := newModelState(newLimits(ModelLimits{Name: "m", RPM: 2}, Config{BurstFraction: 1}), 0)
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
		limit    int64
		fraction float64
		want     int64
	}{
		{0, 0.1, 0}, {600, 0.1, 60}, {3, 0.1, 1}, {10, 0.05, 1}, {101, 0.1, 11}, {7, 1, 7},
		{600, 0.3, 180}, {601, 0.3, 181}, {600, 1.0 / 60, 10}, {601, 1.0 / 60, 11}, {59, 1.0 / 60, 1},
		{60_000_000_000_000, 1.0 / 60, 1_000_000_000_000}, {60_000_000_000_001, 1.0 / 60, 1_000_000_000_001},
		{1 << 40, 1.0 / 6, (1<<40 + 5) / 6},
	} {
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
