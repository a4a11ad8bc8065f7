package breaker_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/breaker"
	"github.com/sluice-dev/sluice/internal/fakeclock"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// setup returns a breaker with the default Config on a fake clock at t0.
func setup(t *testing.T, cfg breaker.Config) (*breaker.Breaker, *fakeclock.Clock) {
	t.Helper()
	clk := fakeclock.New(t0)
	cfg.Now = clk.Now
	return breaker.New(cfg), clk
}

// record reports n outcomes of ordinary calls.
func record(t *testing.T, b *breaker.Breaker, n int, success bool) {
	t.Helper()
	for range n {
		if ok, probe, _ := b.Allow(); !ok || probe {
			t.Fatalf("Allow: got ok=%v probe=%v, want an ordinary call", ok, probe)
		}
		b.Record(success, false)
	}
}

// trip opens b with the defaults: 20 failures.
func trip(t *testing.T, b *breaker.Breaker) {
	t.Helper()
	record(t, b, breaker.DefaultMinRequests, false)
	if got := b.State(); got != breaker.Open {
		t.Fatalf("after %d failures: got %v, want open", breaker.DefaultMinRequests, got)
	}
}

func TestStateString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    breaker.State
		want string
	}{{breaker.Closed, "closed"}, {breaker.Open, "open"}, {breaker.HalfOpen, "half_open"}, {breaker.State(9), "state_9"}} {
		if got := tc.s.String(); got != tc.want {
			t.Errorf("State(%d): got %q, want %q", tc.s, got, tc.want)
		}
	}
}

func TestOpensAtRate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		cfg                 breaker.Config
		successes, failures int
		want                breaker.State
	}{
		{"under min requests, all failing", breaker.Config{}, 0, 19, breaker.Closed},
		{"min requests reached, all failing", breaker.Config{}, 0, 20, breaker.Open},
		{"rate just under", breaker.Config{}, 11, 9, breaker.Closed},
		{"rate exactly at", breaker.Config{}, 10, 10, breaker.Open},
		{"many successes", breaker.Config{}, 100, 49, breaker.Closed},
		{"custom rate and minimum", breaker.Config{MinRequests: 4, FailureRate: 0.25}, 3, 1, breaker.Open},
		{"custom minimum not reached", breaker.Config{MinRequests: 4, FailureRate: 0.25}, 0, 3, breaker.Closed},
		{"out-of-range rate takes the default", breaker.Config{FailureRate: 1.5}, 11, 9, breaker.Closed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, _ := setup(t, tc.cfg)
			record(t, b, tc.successes, true) // successes first: failures decide
			record(t, b, tc.failures, false)
			if got := b.State(); got != tc.want {
				t.Errorf("%d successes then %d failures: got %v, want %v", tc.successes, tc.failures, got, tc.want)
			}
		})
	}
}

func TestOpenRejectsUntilHalfOpen(t *testing.T) {
	t.Parallel()
	b, clk := setup(t, breaker.Config{})
	trip(t, b)
	want := t0.Add(breaker.DefaultOpenFor)
	for _, d := range []time.Duration{0, time.Second, breaker.DefaultOpenFor - time.Nanosecond} {
		clk.Set(t0.Add(d))
		ok, probe, retryAt := b.Allow()
		if ok || probe || !retryAt.Equal(want) {
			t.Errorf("at +%v: got ok=%v probe=%v retryAt=%v, want refused until %v", d, ok, probe, retryAt, want)
		}
	}
	clk.Set(want)
	if got := b.State(); got != breaker.HalfOpen {
		t.Fatalf("at retryAt: got %v, want half_open", got)
	}
	if ok, probe, _ := b.Allow(); !ok || !probe {
		t.Errorf("at retryAt: got ok=%v probe=%v, want a probe", ok, probe)
	}
}

func TestHalfOpenAdmitsOnlyProbes(t *testing.T) {
	t.Parallel()
	b, clk := setup(t, breaker.Config{Probes: 2})
	trip(t, b)
	clk.Advance(breaker.DefaultOpenFor)
	for i := range 2 {
		if ok, probe, _ := b.Allow(); !ok || !probe {
			t.Fatalf("probe %d: got ok=%v probe=%v, want a probe", i, ok, probe)
		}
	}
	ok, _, retryAt := b.Allow()
	if ok {
		t.Fatalf("third call with 2 probes in flight: got ok, want refused")
	}
	if want := clk.Now().Add(breaker.DefaultOpenFor); !retryAt.Equal(want) {
		t.Errorf("retryAt while probes run: got %v, want %v", retryAt, want)
	}
	// A released probe (429: no health signal) frees its slot.
	b.Release(true)
	if ok, probe, _ := b.Allow(); !ok || !probe {
		t.Fatalf("after Release: got ok=%v probe=%v, want a probe", ok, probe)
	}
	// An ordinary call admitted before the breaker opened says nothing now.
	b.Record(false, false)
	if got := b.State(); got != breaker.HalfOpen {
		t.Errorf("after a late ordinary failure: got %v, want half_open", got)
	}
	if ok, _, _ := b.Allow(); ok {
		t.Errorf("late ordinary outcome freed a probe slot")
	}
}

func TestProbesSucceedCloses(t *testing.T) {
	t.Parallel()
	b, clk := setup(t, breaker.Config{})
	trip(t, b)
	clk.Advance(breaker.DefaultOpenFor)
	for i := range breaker.DefaultProbes {
		if ok, probe, _ := b.Allow(); !ok || !probe {
			t.Fatalf("probe %d: got ok=%v probe=%v, want a probe", i, ok, probe)
		}
		if got := b.State(); got != breaker.HalfOpen {
			t.Fatalf("before probe %d's success: got %v, want half_open", i, got)
		}
		b.Record(true, true)
	}
	if got := b.State(); got != breaker.Closed {
		t.Fatalf("after %d probe successes: got %v, want closed", breaker.DefaultProbes, got)
	}
	// The window starts empty: 19 failures do not reopen it.
	record(t, b, breaker.DefaultMinRequests-1, false)
	if got := b.State(); got != breaker.Closed {
		t.Errorf("19 failures after closing: got %v, want closed", got)
	}
	// Closing reset the open period.
	b.Record(false, false)
	if _, _, retryAt := b.Allow(); !retryAt.Equal(clk.Now().Add(breaker.DefaultOpenFor)) {
		t.Errorf("reopened: retryAt %v, want %v", retryAt, clk.Now().Add(breaker.DefaultOpenFor))
	}
}

func TestFailedProbeDoublesOpenFor(t *testing.T) {
	t.Parallel()
	b, clk := setup(t, breaker.Config{OpenFor: 15 * time.Second, MaxOpenFor: 100 * time.Second})
	trip(t, b)
	openFor := 15 * time.Second
	for i, want := range []time.Duration{30 * time.Second, 60 * time.Second, 100 * time.Second, 100 * time.Second} {
		clk.Advance(openFor)
		ok, probe, _ := b.Allow()
		if !ok || !probe {
			t.Fatalf("round %d: got ok=%v probe=%v, want a probe", i, ok, probe)
		}
		b.Record(false, true)
		ok, _, retryAt := b.Allow()
		if ok {
			t.Fatalf("round %d: failed probe left the breaker admitting calls", i)
		}
		if got := retryAt.Sub(clk.Now()); got != want {
			t.Errorf("round %d: open for %v, want %v", i, got, want)
		}
		openFor = want
	}
	// A stale probe from an earlier half-open period counts as nothing
	// while open.
	b.Record(true, true)
	if got := b.State(); got != breaker.Open {
		t.Errorf("stale probe success while open: got %v, want open", got)
	}
}

func TestWindowForgetsOldOutcomes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		after time.Duration // between the 19 old failures and the 20th
		want  breaker.State
	}{
		{"same second", 0, breaker.Open},
		{"28s later: still in the window", 28 * time.Second, breaker.Open},
		{"30s later: out of the window", 30 * time.Second, breaker.Closed},
		{"31s later: another bucket", 31 * time.Second, breaker.Closed},
		{"45s later", 45 * time.Second, breaker.Closed},
		{"a minute later", time.Minute, breaker.Closed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, clk := setup(t, breaker.Config{})
			record(t, b, breaker.DefaultMinRequests-1, false)
			clk.Advance(tc.after)
			record(t, b, 1, false)
			if got := b.State(); got != tc.want {
				t.Errorf("19 failures, then one %v later: got %v, want %v", tc.after, got, tc.want)
			}
		})
	}
}

func TestConcurrentAllowRecord(t *testing.T) {
	t.Parallel()
	b, clk := setup(t, breaker.Config{MinRequests: 5, OpenFor: time.Second, MaxOpenFor: 4 * time.Second, Probes: 2})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				ok, probe, retryAt := b.Allow()
				if !ok {
					if retryAt.IsZero() {
						t.Errorf("refused without retryAt")
						return
					}
					clk.Advance(100 * time.Millisecond)
					continue
				}
				switch (g + i) % 3 {
				case 0:
					b.Release(probe)
				default:
					b.Record((g+i)%3 == 1, probe)
				}
			}
		})
	}
	wg.Wait()
	_ = b.State()
}

func TestSet(t *testing.T) {
	t.Parallel()
	clk := fakeclock.New(t0)
	s := breaker.NewSet(breaker.Config{MinRequests: 1, Now: clk.Now})
	a := s.Get("openai/gpt-4o-mini")
	if s.Get("openai/gpt-4o-mini") != a {
		t.Fatalf("Get twice: got two breakers for one key")
	}
	a.Record(false, false)
	s.Get("anthropic/claude-3-5-haiku")
	got := s.States()
	want := map[string]breaker.State{"openai/gpt-4o-mini": breaker.Open, "anthropic/claude-3-5-haiku": breaker.Closed}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("States: got %v, want %v", got, want)
	}

	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 100 {
				s.Get(fmt.Sprintf("p/m%d", (i+j)%5)).Record(true, false)
				_ = s.States()
			}
		})
	}
	wg.Wait()
	if got := len(s.States()); got != 7 {
		t.Errorf("keys: got %d, want 7", got)
	}
}

// A ticket is settled once: its deferred Release gives a probe slot back on
// any way out of a call, and after Record (or a first Release) it frees
// nothing that another probe holds.
func TestTicketSettlesOnce(t *testing.T) {
	t.Parallel()
	b, clk := setup(t, breaker.Config{Probes: 2})
	trip(t, b)
	clk.Advance(breaker.DefaultOpenFor)
	abandoned := func() {
		tk, _ := b.Take()
		if !tk.Probe() {
			t.Fatalf("half-open Take: got %+v, want a probe", tk)
		}
		defer tk.Release()
		// The call is abandoned here (a drain, a shutdown): no Record.
	}
	for range 5 {
		abandoned() // would hold both slots for good without the deferred Release
	}
	held, _ := b.Take()
	other, _ := b.Take()
	if held == nil || other == nil {
		t.Fatalf("after abandoned probes: Take = %v, %v; want both slots free", held, other)
	}
	if tk, _ := b.Take(); tk != nil {
		t.Fatalf("a third probe with 2 in flight was admitted")
	}
	held.Record(true)
	held.Release() // settled already: must not free other's slot
	held.Release()
	if tk, _ := b.Take(); tk == nil {
		t.Fatalf("the slot the recorded probe freed is not free")
	} else if tk2, _ := b.Take(); tk2 != nil {
		t.Fatalf("a settled ticket's second Release freed another probe's slot")
	}
	var none *breaker.Ticket
	none.Release() // a refused call's nil ticket: nothing to settle
	none.Record(false)
}
