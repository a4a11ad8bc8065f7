package sim_test

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/fakeclock"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// rateHeaderNames lists the x-ratelimit-* headers of a response.
func rateHeaderNames(h http.Header) []string {
	var names []string
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "x-ratelimit-") {
			names = append(names, k)
		}
	}
	return names
}

func retryMS(t *testing.T, r reply) time.Duration {
	t.Helper()
	ms, err := strconv.Atoi(r.header.Get("retry-after-ms"))
	if err != nil {
		t.Fatalf("retry-after-ms %q: %v", r.header.Get("retry-after-ms"), err)
	}
	return time.Duration(ms) * time.Millisecond
}

// TestQuantizedDefault: with no profile and no burst fraction, RPM 600 is
// enforced as 10 requests in any second, and the headers still describe
// only the minute.
func TestQuantizedDefault(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 600}}, Now: clk.Now})
	b := body(model, "hi", 10)
	for range 10 {
		wantStatus(t, chat(t, url, b), http.StatusOK)
		clk.Advance(50 * time.Millisecond)
	}
	// +500ms: the 11th in (t-1s, t]. With the rejection counted, the first
	// two (+0, +50ms) must leave: it fits at +1.05s.
	r := chat(t, url, b)
	wantStatus(t, r, http.StatusTooManyRequests)
	if e := r.apiErr(t); e["type"] != "requests" || e["code"] != "rate_limit_exceeded" ||
		!strings.Contains(e["message"].(string), "requests per second (RPM quantized to 1s): Limit 10, Used 10, Requested 1. Please try again in 550ms.") {
		t.Errorf("error %v", e)
	}
	wantHeader(t, r, "retry-after-ms", "550")
	wantHeader(t, r, "Retry-After", "1")
	// The headers describe the minute, never the quantum.
	wantHeader(t, r, "x-ratelimit-limit-requests", "600")
	wantHeader(t, r, "x-ratelimit-remaining-requests", "589")
	wantHeader(t, r, "x-ratelimit-reset-requests", "1m0s")
	clk.Advance(550 * time.Millisecond)
	wantStatus(t, chat(t, url, b), http.StatusOK)

	st := s.Stats()
	ms := st.Models[model]
	if st.Profile != sim.ProfileQuantized || ms.BurstRequests != 10 || ms.ShortWindowSeconds != 1 || ms.ShortRequests != 10 ||
		ms.MaxAdmittedRequestsIn1s != 10 || ms.MaxRequestsIn1s != 11 || ms.MaxRequestsInShort != 0 ||
		ms.RateLimitedBy["requests_short_window"] != 1 {
		t.Errorf("profile %q, stats %+v", st.Profile, ms)
	}
}

// TestOversizedRequestOnlyIntoEmptySecond: a request with more tokens than
// the 1-s quantum runs only in a second that holds nothing else.
func TestOversizedRequestOnlyIntoEmptySecond(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, TPM: 60_000}}, Now: clk.Now}) // quantum 1000 tokens
	small, big := body(model, "hi", 10), body(model, "hi", 1500)
	if cost(t, big) <= 1000 || cost(t, small)+cost(t, big) > 60_000 {
		t.Fatalf("costs %d, %d do not fit the test", cost(t, small), cost(t, big))
	}
	wantStatus(t, chat(t, url, small), http.StatusOK)
	clk.Advance(200 * time.Millisecond)
	r := chat(t, url, big)
	wantStatus(t, r, http.StatusTooManyRequests) // the second holds the small one
	if e := r.apiErr(t); e["type"] != "tokens" {
		t.Errorf("error %v", e)
	}
	wantHeader(t, r, "retry-after-ms", "800")
	clk.Advance(800 * time.Millisecond)
	wantStatus(t, chat(t, url, big), http.StatusOK) // alone in its second
	clk.Advance(500 * time.Millisecond)
	r = chat(t, url, small)
	wantStatus(t, r, http.StatusTooManyRequests) // nothing joins it
	wantHeader(t, r, "retry-after-ms", "500")
	clk.Advance(500 * time.Millisecond)
	wantStatus(t, chat(t, url, small), http.StatusOK)
	if ms := s.Stats().Models[model]; ms.MaxTokensIn1s != cost(t, big) || ms.RateLimitedBy["tokens_short_window"] != 2 {
		t.Errorf("stats %+v", ms)
	}
}

func TestTokenBucket(t *testing.T) {
	t.Parallel()
	b := body(model, "hi", 10)
	for _, tc := range []struct {
		name     string
		seconds  float64
		capacity int // requests at RPM 120
	}{{"default 1s", 0, 2}, {"3s", 3, 6}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 120}}, Profile: sim.ProfileTokenBucket,
				BucketSeconds: tc.seconds, Now: clk.Now})
			// Full at the start: capacity requests at once, then one per
			// 500 ms (120/60 per second).
			for range tc.capacity {
				wantStatus(t, chat(t, url, b), http.StatusOK)
			}
			r := chat(t, url, b)
			wantStatus(t, r, http.StatusTooManyRequests)
			if e := r.apiErr(t); e["type"] != "requests" || !strings.Contains(e["message"].(string), "bucket") {
				t.Errorf("error %v", e)
			}
			wantHeader(t, r, "retry-after-ms", "500")
			wantHeader(t, r, "x-ratelimit-limit-requests", "120")
			clk.Advance(300 * time.Millisecond)
			wantHeader(t, chat(t, url, b), "retry-after-ms", "200") // rejections draw nothing
			clk.Advance(200 * time.Millisecond)
			wantStatus(t, chat(t, url, b), http.StatusOK)
			// A long pause refills no more than the capacity.
			clk.Advance(20 * time.Second)
			for range tc.capacity {
				wantStatus(t, chat(t, url, b), http.StatusOK)
			}
			wantStatus(t, chat(t, url, b), http.StatusTooManyRequests)
			ms := s.Stats().Models[model]
			if ms.ShortWindowSeconds != max(tc.seconds, 1) || ms.ShortRequests != float64(tc.capacity) || ms.BurstRequests != 0 ||
				ms.RateLimitedBy["requests_bucket"] != 3 {
				t.Errorf("stats %+v", ms)
			}
		})
	}

	t.Run("oversized", func(t *testing.T) {
		t.Parallel()
		clk := newClock()
		// 100 tokens per second, capacity 100.
		_, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, TPM: 6000}}, Profile: sim.ProfileTokenBucket, Now: clk.Now})
		small, big := body(model, "hi", 5), body(model, "hi", 140)
		if cost(t, big) <= 100 {
			t.Fatalf("cost %d", cost(t, big))
		}
		wantStatus(t, chat(t, url, big), http.StatusOK) // full: admitted, and empties it
		r := chat(t, url, small)
		wantStatus(t, r, http.StatusTooManyRequests)
		// Empty, so the small one waits for its own tokens at 0.1 per ms.
		wantHeader(t, r, "retry-after-ms", strconv.Itoa(10*cost(t, small)))
		clk.Advance(time.Duration(10*cost(t, small)) * time.Millisecond)
		wantStatus(t, chat(t, url, small), http.StatusOK)
		// The big one needs the bucket full again: 1 s after it was empty.
		r = chat(t, url, big)
		wantStatus(t, r, http.StatusTooManyRequests)
		wantHeader(t, r, "retry-after-ms", "1000")
		clk.Advance(time.Second)
		wantStatus(t, chat(t, url, big), http.StatusOK)
	})
}

func TestAzureProfile(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 60, TPM: 600_000}}, Profile: sim.ProfileAzure, Now: clk.Now})
	b := body(model, "hi", 10)
	// 10 requests per 10 s, and no 1-s window: 5 at once pass.
	for i := range 10 {
		r := chat(t, url, b)
		wantStatus(t, r, http.StatusOK)
		if i == 0 {
			wantHeader(t, r, "x-ratelimit-remaining-requests", "59")
			wantHeader(t, r, "x-ratelimit-remaining-tokens", strconv.Itoa(600_000-cost(t, b)))
			if names := rateHeaderNames(r.header); len(names) != 2 {
				t.Errorf("rate headers %v, want only the two remaining ones", names)
			}
		}
		if i == 4 {
			clk.Advance(8 * time.Second)
		}
	}
	// +9.5s: the 11th in (t-10s, t]; with the rejection counted, two of
	// the five at +0 must leave: it fits at +10s.
	clk.Advance(1500 * time.Millisecond)
	r := chat(t, url, b)
	wantStatus(t, r, http.StatusTooManyRequests)
	if e := r.apiErr(t); e["type"] != "requests" || !strings.Contains(e["message"].(string), "requests per 10s (RPM quantized to 10s): Limit 10, Used 10") {
		t.Errorf("error %v", e)
	}
	wantHeader(t, r, "retry-after-ms", "500")
	wantHeader(t, r, "Retry-After", "1")
	wantHeader(t, r, "x-ratelimit-remaining-requests", "49")
	if names := rateHeaderNames(r.header); len(names) != 2 {
		t.Errorf("rate headers %v on a 429", names)
	}
	clk.Advance(500 * time.Millisecond)
	wantStatus(t, chat(t, url, b), http.StatusOK)

	ms := s.Stats().Models[model]
	if ms.ShortWindowSeconds != 10 || ms.ShortRequests != 10 || ms.ShortTokens != 100_000 || ms.BurstRequests != 0 ||
		ms.MaxAdmittedRequestsInShort != 10 || ms.MaxRequestsInShort != 11 || ms.MaxAdmittedRequestsIn1s != 5 {
		t.Errorf("stats %+v", ms)
	}
}

// TestAccelerationRamp: RPM 600 has a floor of 25 requests per 10 s and may
// double every 10 s. Jumping from idle to the full 10 per second is cut at
// 25; stepping up in moderate steps never is.
func TestAccelerationRamp(t *testing.T) {
	t.Parallel()
	cfg := func(clk *fakeclock.Clock) sim.Config {
		return sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 600}}, Profile: sim.ProfileAcceleration, Now: clk.Now}
	}
	b := body(model, "hi", 10)

	t.Run("jump", func(t *testing.T) {
		t.Parallel()
		clk := newClock()
		s, url := start(t, cfg(clk))
		for range 25 {
			wantStatus(t, chat(t, url, b), http.StatusOK)
			clk.Advance(100 * time.Millisecond)
		}
		r := chat(t, url, b) // +2.5s
		wantStatus(t, r, http.StatusTooManyRequests)
		e := r.apiErr(t)
		if e["type"] != "requests" || e["code"] != "rate_limit_exceeded" ||
			!strings.Contains(e["message"].(string), "acceleration limit of requests per min (RPM): Limit 25, Used 25, Requested 1") {
			t.Errorf("error %v", e)
		}
		// At +10s the first moves to the previous 10 s: 24 recent, cap 25.
		wantHeader(t, r, "retry-after-ms", "7500")
		wantHeader(t, r, "Retry-After", "8")
		wantHeader(t, r, "x-ratelimit-limit-requests", "600")
		clk.Advance(7500*time.Millisecond - time.Millisecond)
		wantStatus(t, chat(t, url, b), http.StatusTooManyRequests)
		clk.Advance(time.Millisecond)
		wantStatus(t, chat(t, url, b), http.StatusOK)
		if ms := s.Stats().Models[model]; ms.RateLimitedBy["requests_acceleration"] != 2 || ms.AccelFloorRequests != 25 || ms.AccelGrowth != 2 {
			t.Errorf("stats %+v", ms)
		}
	})

	t.Run("gradual", func(t *testing.T) {
		t.Parallel()
		clk := newClock()
		s, url := start(t, cfg(clk))
		// 20 s at each rate: 2, 3.3, 5, 8.3, then 10 per second.
		for _, every := range []time.Duration{500, 300, 200, 120, 100} {
			for at := time.Duration(0); at < 20*time.Second; at += every * time.Millisecond {
				if r := chat(t, url, b); r.status != http.StatusOK {
					t.Fatalf("every %dms, at +%v: status %d: %s", every, at, r.status, r.body)
				}
				clk.Advance(every * time.Millisecond)
			}
		}
		if ms := s.Stats().Models[model]; ms.RateLimited != 0 || ms.Admitted != 40+67+100+167+200 || ms.MaxAdmittedRequestsIn1s != 10 {
			t.Errorf("stats %+v", ms)
		}
	})
}

func TestHiddenProfile(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 60, TPM: 1000}}, Profile: sim.ProfileHidden, Now: clk.Now})
	b := body(model, "hi", 10)
	ok := chat(t, url, b)
	wantStatus(t, ok, http.StatusOK)
	r := chat(t, url, b)
	wantStatus(t, r, http.StatusTooManyRequests)
	digits := regexp.MustCompile(`[0-9]`)
	e := r.apiErr(t)
	if e["message"] != "Rate limit reached. Please try again later." || e["type"] != "requests" || e["code"] != "rate_limit_exceeded" {
		t.Errorf("error %v", e)
	}
	wantHeader(t, r, "retry-after-ms", "1000")
	wantHeader(t, r, "Retry-After", "1")
	big := chat(t, url, body(model, strings.Repeat("lorem ipsum ", 500), 10))
	wantStatus(t, big, http.StatusTooManyRequests)
	if m := big.apiErr(t)["message"].(string); !strings.HasPrefix(m, "Request too large.") || big.header.Get("Retry-After") != "" {
		t.Errorf("too large: %q, Retry-After %q", m, big.header.Get("Retry-After"))
	}
	for _, x := range []reply{ok, r, big} {
		if names := rateHeaderNames(x.header); len(names) != 0 {
			t.Errorf("status %d: rate headers %v", x.status, names)
		}
		if x.status != http.StatusOK && digits.MatchString(x.apiErr(t)["message"].(string)) {
			t.Errorf("status %d: message with numbers: %s", x.status, x.body)
		}
	}
	if st := s.Stats(); st.Profile != sim.ProfileHidden || st.Models[model].BurstRequests != 1 {
		t.Errorf("stats %+v", st)
	}

	// NoRateHeaders alone drops the headers but keeps the numbers.
	_, url = start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 1}}, NoRateHeaders: true, Now: clk.Now})
	wantStatus(t, chat(t, url, b), http.StatusOK)
	r = chat(t, url, b)
	if names := rateHeaderNames(r.header); r.status != http.StatusTooManyRequests || len(names) != 0 ||
		!strings.Contains(r.apiErr(t)["message"].(string), "Limit 1") || r.header.Get("retry-after-ms") == "" {
		t.Errorf("no-rate-headers: status %d, headers %v, body %s", r.status, names, r.body)
	}
}

// TestRetryAfterExactPerProfile replays a rejection on two twin simulators:
// waiting retry-after-ms is enough, a millisecond less is not.
func TestRetryAfterExactPerProfile(t *testing.T) {
	t.Parallel()
	small, big := body(model, "hi", 10), body(model, "hi", 1500)
	type step struct {
		after time.Duration
		body  string
	}
	// every returns n steps of small spaced by d, the first at once.
	every := func(n int, d time.Duration) []step {
		s := make([]step, n)
		for i := range s {
			s[i] = step{d, small}
		}
		s[0].after = 0
		return s
	}
	for _, tc := range []struct {
		name   string
		cfg    sim.Config
		steps  []step // the last is rejected
		wantMS int
	}{
		{"quantized requests", sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 600}}}, every(11, 50*time.Millisecond), 550},
		{"quantized tokens", sim.Config{Models: []sim.ModelLimits{{Name: model, TPM: 60_000}}}, []step{{0, small}, {200 * time.Millisecond, big}}, 800},
		{"quantized minute", sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 3}}}, every(4, 7*time.Second), 46_000},
		{"hidden", sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 600}}, Profile: sim.ProfileHidden}, every(11, 50*time.Millisecond), 550},
		{"token bucket requests", sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 120}}, Profile: sim.ProfileTokenBucket},
			[]step{{0, small}, {0, small}, {123 * time.Millisecond, small}}, 377},
		{"token bucket tokens", sim.Config{Models: []sim.ModelLimits{{Name: model, TPM: 60_000}}, Profile: sim.ProfileTokenBucket},
			[]step{{0, big}, {5 * time.Millisecond, small}}, 0},
		{"azure", sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 60}}, Profile: sim.ProfileAzure}, every(11, 950*time.Millisecond), 1450},
		{"acceleration", sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 600}}, Profile: sim.ProfileAcceleration}, every(26, 100*time.Millisecond), 7500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := func(wait func(time.Duration) time.Duration) (reply, reply) {
				clk := newClock()
				cfg := tc.cfg
				cfg.Now = clk.Now
				_, url := start(t, cfg)
				var r reply
				for i, st := range tc.steps {
					clk.Advance(st.after)
					r = chat(t, url, st.body)
					want := http.StatusOK
					if i == len(tc.steps)-1 {
						want = http.StatusTooManyRequests
					}
					wantStatus(t, r, want)
				}
				clk.Advance(wait(retryMS(t, r)))
				return r, chat(t, url, tc.steps[len(tc.steps)-1].body)
			}
			rejected, after := run(func(d time.Duration) time.Duration { return d })
			wantStatus(t, after, http.StatusOK)
			_, early := run(func(d time.Duration) time.Duration { return d - time.Millisecond })
			wantStatus(t, early, http.StatusTooManyRequests)

			ms := retryMS(t, rejected).Milliseconds()
			if tc.wantMS > 0 && ms != int64(tc.wantMS) {
				t.Errorf("retry-after-ms %d, want %d", ms, tc.wantMS)
			}
			wantHeader(t, rejected, "Retry-After", strconv.FormatInt((ms+999)/1000, 10))
		})
	}
}

func TestUnknownProfileNamesTheValidOnes(t *testing.T) {
	t.Parallel()
	_, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model}}, Profile: "openai"})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, p := range sim.Profiles() {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not name %q", err, p)
		}
	}
	for _, p := range append(sim.Profiles(), "") {
		if _, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 1, TPM: 1}}, Profile: p}); err != nil {
			t.Errorf("profile %q: %v", p, err)
		}
	}
}
