package provider

import (
	"math/rand/v2"
	"net/http"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		h    http.Header
		want time.Duration
	}{
		{"absent", http.Header{}, 0},
		{"nil", nil, 0},
		{"seconds", http.Header{"Retry-After": {"3"}}, 3 * time.Second},
		{"float seconds", http.Header{"Retry-After": {"1.5"}}, 1500 * time.Millisecond},
		{"spaces", http.Header{"Retry-After": {" 2 "}}, 2 * time.Second},
		{"ms wins", http.Header{"Retry-After-Ms": {"250"}, "Retry-After": {"9"}}, 250 * time.Millisecond},
		{"float ms", http.Header{"Retry-After-Ms": {"12.5"}}, 12500 * time.Microsecond},
		{"garbage ms falls back", http.Header{"Retry-After-Ms": {"soon"}, "Retry-After": {"2"}}, 2 * time.Second},
		{"zero ms falls back", http.Header{"Retry-After-Ms": {"0"}, "Retry-After": {"2"}}, 2 * time.Second},
		{"http date", http.Header{"Retry-After": {now.Add(90 * time.Second).Format(http.TimeFormat)}}, 90 * time.Second},
		{"http date past", http.Header{"Retry-After": {now.Add(-time.Minute).Format(http.TimeFormat)}}, 0},
		{"garbage", http.Header{"Retry-After": {"tomorrow-ish"}}, 0},
		{"negative", http.Header{"Retry-After": {"-5"}}, 0},
		{"negative ms", http.Header{"Retry-After-Ms": {"-5"}}, 0},
		{"nan", http.Header{"Retry-After": {"NaN"}}, 0},
		{"inf", http.Header{"Retry-After": {"+Inf"}}, 0},
		{"huge capped", http.Header{"Retry-After": {"1e300"}}, maxHint},
		{"huge ms capped", http.Header{"Retry-After-Ms": {"1e300"}}, maxHint},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := ParseRetryAfter(tc.h, now); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParseRateLimit(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	rl := ParseRateLimit(http.Header{
		"X-Ratelimit-Limit-Requests":     {"500"},
		"X-Ratelimit-Limit-Tokens":       {"30000"},
		"X-Ratelimit-Remaining-Requests": {"499"},
		"X-Ratelimit-Remaining-Tokens":   {"29000"},
		"X-Ratelimit-Reset-Requests":     {"120ms"},
		"X-Ratelimit-Reset-Tokens":       {"1m30.5s"},
	}, now)
	want := RateLimit{500, 30000, 499, 29000, 120 * time.Millisecond, 90500 * time.Millisecond, -1, -1, 0}
	if rl != want {
		t.Errorf("openai: got %+v want %+v", rl, want)
	}
	rl = ParseRateLimit(http.Header{
		"Anthropic-Ratelimit-Requests-Limit":     {"50"},
		"Anthropic-Ratelimit-Requests-Remaining": {"49"},
		"Anthropic-Ratelimit-Requests-Reset":     {now.Add(2 * time.Second).Format(time.RFC3339)},
		"Anthropic-Ratelimit-Tokens-Limit":       {"40000"},
		"Anthropic-Ratelimit-Tokens-Remaining":   {"39000"},
		"Anthropic-Ratelimit-Tokens-Reset":       {now.Add(6 * time.Minute).Format(time.RFC3339)},
	}, now)
	want = RateLimit{50, 40000, 49, 39000, 2 * time.Second, 6 * time.Minute, -1, -1, 0}
	if rl != want {
		t.Errorf("anthropic: got %+v want %+v", rl, want)
	}
	rl = ParseRateLimit(http.Header{
		"Anthropic-Ratelimit-Input-Tokens-Limit":     {"20000"},
		"Anthropic-Ratelimit-Input-Tokens-Remaining": {"0"},
		"Anthropic-Ratelimit-Input-Tokens-Reset":     {now.Add(-time.Second).Format(time.RFC3339)},
	}, now)
	want = RateLimit{-1, 20000, -1, 0, 0, 0, -1, -1, 0}
	if rl != want {
		t.Errorf("anthropic input tokens: got %+v want %+v", rl, want)
	}
	if rl := ParseRateLimit(http.Header{}, now); rl != (RateLimit{-1, -1, -1, -1, 0, 0, -1, -1, 0}) {
		t.Errorf("absent: %+v", rl)
	}
	for in, want := range map[string]time.Duration{
		"1s": time.Second, "6m0s": 6 * time.Minute, "120ms": 120 * time.Millisecond, "1m30.5s": 90500 * time.Millisecond,
		"0.5": 500 * time.Millisecond, "2d": maxHint, "0d3s": 3 * time.Second, "1d2h": maxHint,
	} {
		if got, ok := parseResetDuration(in); !ok || got != want {
			t.Errorf("parseResetDuration(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "x", "-1s", "-3", "d", "1dx", "xd1s"} {
		if got, ok := parseResetDuration(in); ok {
			t.Errorf("parseResetDuration(%q) = %v, want failure", in, got)
		}
	}
}

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	rnd := rand.New(rand.NewPCG(1, 2))
	base, maxD := 100*time.Millisecond, 2*time.Second
	for attempt := 1; attempt <= 12; attempt++ {
		ceiling := min(maxD, base<<(attempt-1))
		var lo, hi bool
		for range 2000 {
			d := Backoff(attempt, base, maxD, 0, rnd)
			if d < 0 || d > ceiling {
				t.Fatalf("attempt %d: %v outside [0, %v]", attempt, d, ceiling)
			}
			lo = lo || d < ceiling/4
			hi = hi || d > ceiling*3/4
		}
		if !lo || !hi {
			t.Errorf("attempt %d: jitter does not spread over [0, %v] (low %v high %v)", attempt, ceiling, lo, hi)
		}
	}
	// Never below Retry-After; never above max when Retry-After < max.
	for range 2000 {
		ra := time.Duration(rnd.Int64N(int64(3 * time.Second)))
		d := Backoff(rnd.IntN(20)+1, base, maxD, ra, rnd)
		if d < ra {
			t.Fatalf("%v below retry-after %v", d, ra)
		}
		if ra < maxD && d > maxD {
			t.Fatalf("%v above max %v (retry-after %v)", d, maxD, ra)
		}
	}
	// Edge inputs neither panic nor loop.
	_ = Backoff(0, base, maxD, 0, nil)
	_ = Backoff(-3, 0, 0, 0, nil)
	if d := Backoff(1<<62, 0, 0, time.Second, nil); d != time.Second {
		t.Errorf("zero base: %v", d)
	}
	if d := Backoff(1<<30, time.Hour, 0, 0, rnd); d > maxBackoff {
		t.Errorf("uncapped: %v", d)
	}
}

func TestPlan(t *testing.T) {
	t.Parallel()
	p := Policy{MaxAttempts: 5, MaxElapsed: time.Minute, BaseDelay: 100 * time.Millisecond, MaxDelay: 10 * time.Second}
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	now := t0.Add(time.Second)
	dl := func(d time.Duration) *time.Time { x := now.Add(d); return &x }
	rnd := rand.New(rand.NewPCG(3, 4))
	cases := []struct {
		name     string
		p        Policy
		o        Outcome
		attempt  int
		deadline *time.Time
		retry    bool
		reason   string
	}{
		{"rate limited", p, Outcome{Class: Retry}, 1, nil, true, "rate_limited"},
		{"overloaded", p, Outcome{Class: Overloaded}, 2, dl(time.Hour), true, "overloaded"},
		{"connect", p, Outcome{Class: ConnectFailed, SafeToRetry: true}, 1, nil, true, "connect"},
		{"success", p, Outcome{Class: Success}, 1, nil, false, ReasonNotRetryable},
		{"operator", p, Outcome{Class: OperatorAction}, 1, nil, false, ReasonNotRetryable},
		{"fail", p, Outcome{Class: Fail}, 1, nil, false, ReasonNotRetryable},
		{"auth", p, Outcome{Class: AuthBroken}, 1, nil, false, ReasonNotRetryable},
		{"unknown", p, Outcome{Class: Unknown, OutcomeUnknown: true}, 1, nil, false, ReasonOutcomeUnknown},
		{"attempts", p, Outcome{Class: Retry}, 5, nil, false, ReasonAttempts},
		{"max attempts zero means one", Policy{}, Outcome{Class: Retry}, 1, nil, false, ReasonAttempts},
		{"retry-after past deadline", p, Outcome{Class: Retry, RetryAfter: 5 * time.Second}, 1, dl(4 * time.Second), false, ReasonDeadline},
		{"retry-after fits deadline", p, Outcome{Class: Retry, RetryAfter: 3 * time.Second}, 1, dl(4 * time.Second), true, "rate_limited"},
		{"deadline passed", p, Outcome{Class: Overloaded}, 1, dl(-time.Second), false, ReasonDeadline},
		{"deadline now", p, Outcome{Class: Overloaded}, 1, dl(0), false, ReasonDeadline},
		{"retry-after past elapsed budget", p, Outcome{Class: Retry, RetryAfter: 2 * time.Minute}, 1, nil, false, ReasonElapsedExceeded},
		{"elapsed spent", Policy{MaxAttempts: 5, MaxElapsed: time.Second}, Outcome{Class: Retry}, 1, nil, false, ReasonElapsedExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := Plan(tc.p, tc.o, tc.attempt, t0, now, tc.deadline, rand.New(rand.NewPCG(5, 6)))
			if d.Retry != tc.retry || d.Reason != tc.reason {
				t.Errorf("got %+v, want retry=%v reason=%q", d, tc.retry, tc.reason)
			}
			if d.Retry && d.Delay < tc.o.RetryAfter {
				t.Errorf("delay %v cuts retry-after %v short", d.Delay, tc.o.RetryAfter)
			}
			if !d.Retry && d.Delay != 0 {
				t.Errorf("no retry but delay %v", d.Delay)
			}
		})
	}

	// Randomized: a retry never lands past the deadline or the elapsed
	// budget, and never before Retry-After.
	for i := range 20000 {
		left := time.Duration(rnd.Int64N(int64(20 * time.Second)))
		deadline := now.Add(left)
		o := Outcome{Class: []Class{Retry, Overloaded, ConnectFailed}[i%3]}
		if i%2 == 0 {
			o.RetryAfter = time.Duration(rnd.Int64N(int64(15 * time.Second)))
		}
		attempt := rnd.IntN(6) + 1
		d := Plan(p, o, attempt, t0, now, &deadline, rnd)
		if !d.Retry {
			if attempt < p.MaxAttempts && o.RetryAfter < left && left > 0 {
				t.Fatalf("gave up although retry-after %v fits %v: %+v", o.RetryAfter, left, d)
			}
			continue
		}
		if now.Add(d.Delay).After(deadline) {
			t.Fatalf("delay %v passes deadline %v away", d.Delay, left)
		}
		if now.Add(d.Delay).After(t0.Add(p.MaxElapsed)) {
			t.Fatalf("delay %v passes the elapsed budget", d.Delay)
		}
		if d.Delay < o.RetryAfter {
			t.Fatalf("delay %v below retry-after %v", d.Delay, o.RetryAfter)
		}
		if o.RetryAfter < p.MaxDelay && d.Delay > p.MaxDelay {
			t.Fatalf("delay %v above max delay", d.Delay)
		}
	}
}
