package budget_test

import (
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
)

func TestLeadFromTransits(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	t0 := time.Unix(1_700_000_000, 0)
	many := func(n int, d time.Duration) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = d
		}
		return out
	}
	// 100 transits: 90 of 1 ms, 9 of 4 ms and one of the given length.
	spread := func(slowest time.Duration) []time.Duration {
		return append(append(many(90, ms), many(9, 4*ms)...), slowest)
	}
	for _, c := range []struct {
		name string
		ds   []time.Duration
		want time.Duration
	}{
		{"nothing known: the bound", nil, 20 * ms},
		{"too few known: the bound", many(3, ms), 20 * ms},
		{"steady transit plus the margin", many(20, 2*ms), 3 * ms},
		{"the slowest tenth is late, within the allowance", spread(4 * ms), 2 * ms},
		{"a lone slow call beyond the tail is late", spread(30 * ms), 2 * ms},
		{"a slow tail raises the lead to bound its lateness", append(spread(4*ms), many(5, 12*ms)...), 7 * ms},
		{"slow transits: capped at the bound", many(20, 50*ms), 20 * ms},
		{"instant transits: raised to the floor", many(20, 0), ms},
		{"a negative transit counts as none", many(20, -5*ms), ms},
	} {
		e := &budget.LeadEstimator{Min: ms, Max: 20 * ms, Quantile: 0.9, Margin: ms, Tail: 0.99, Late: 5 * ms, Samples: 128, MinSamples: 4}
		for _, d := range c.ds {
			e.Observe(t0, d)
		}
		if got := e.Lead(t0); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestLeadForgets(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	t0 := time.Unix(1_700_000_000, 0)
	type step struct {
		at      time.Duration // after t0
		observe time.Duration // -1: only ask
		want    time.Duration // -1: do not ask
	}
	for _, c := range []struct {
		name  string
		steps []step
	}{
		{"the bound until enough are known", []step{
			{0, -1, 20 * ms},
			{1 * ms, 2 * ms, 20 * ms},
			{2 * ms, 2 * ms, 20 * ms},
			{3 * ms, 2 * ms, 3 * ms}, // the third: trusted
		}},
		{"a slow transit raises it at once", []step{
			{0, 2 * ms, -1}, {0, 2 * ms, -1}, {0, 2 * ms, 3 * ms},
			{1 * ms, 9 * ms, 10 * ms},
		}},
		{"the oldest fall out of the ring", []step{
			{0, 9 * ms, -1}, {0, 2 * ms, -1}, {0, 2 * ms, 10 * ms},
			{1 * ms, 2 * ms, -1}, // overwrites the 9 ms
			{1 * ms, -1, 3 * ms},
		}},
		{"transits older than the window are forgotten", []step{
			{0, 9 * ms, -1}, {0, 9 * ms, -1}, {0, 9 * ms, 10 * ms},
			{61 * time.Second, -1, 20 * ms},
			{61 * time.Second, 2 * ms, 20 * ms},
		}},
	} {
		e := &budget.LeadEstimator{Min: ms, Max: 20 * ms, Quantile: 0.99, Margin: ms, Tail: 1, Late: 20 * ms, Samples: 3, MinSamples: 3, Window: time.Minute}
		for i, s := range c.steps {
			now := t0.Add(s.at)
			if s.observe != -1 {
				e.Observe(now, s.observe)
			}
			if s.want != -1 {
				if got := e.Lead(now); got != s.want {
					t.Errorf("%s, step %d: got %v, want %v", c.name, i, got, s.want)
				}
			}
		}
	}
}

func TestPlacementUsesTheLearnedLead(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	lead := 20 * time.Millisecond
	st := budget.NewStore(newFakeKV(), budget.Params{Slice: 250 * time.Millisecond, BurstFraction: 1.0 / 60, Short: time.Second,
		Lead: 20 * time.Millisecond, Tolerance: 15 * time.Millisecond, Horizon: 2 * time.Second}, clock)
	st.Lead = func(time.Time) time.Duration { return lead }
	lim := budget.Limits{RPM: 6000}
	for _, c := range []struct {
		lead time.Duration
		want time.Duration // the instant, after now
	}{
		{20 * time.Millisecond, 20 * time.Millisecond}, {2 * time.Millisecond, 2 * time.Millisecond},
		// To the nearest millisecond: the lead is learned, not a bound.
		{2400 * time.Microsecond, 2 * time.Millisecond}, {2600 * time.Microsecond, 3 * time.Millisecond},
	} {
		now = now.Add(time.Second) // room: the last placement is long past
		lead = c.lead
		g, err := st.TakeAt(t.Context(), "k", lim, []budget.Cost{{Requests: 1}}, nil)
		if err != nil || g.N != 1 {
			t.Fatalf("lead %v: got %d granted, err %v", c.lead, g.N, err)
		}
		if got := g.SendAt[0].Sub(now); got != c.want {
			t.Errorf("lead %v: planned %v ahead, want %v", c.lead, got, c.want)
		}
		if !g.Planned.Equal(now) {
			t.Errorf("lead %v: planned at %v, want now (%v)", c.lead, g.Planned, now)
		}
	}
}
