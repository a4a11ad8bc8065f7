package systest

import (
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestReportArrivalsBlamesOnlyTheWindow: a refusal is put down to jitter
// only when a call in the window that refused it reached the provider later
// than the tolerance; a late call elsewhere in the run excuses nothing (it
// once excused every refusal of the run), and a call that left early, from
// its reservation's send_from, is not late.
func TestReportArrivalsBlamesOnlyTheWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const tol = 15 * time.Millisecond
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	plans := &Plans{at: map[string][]plan{
		"early":    {{from: ms(0), at: ms(0)}}, // arrives 100 ms late, 3 s before the refusals
		"intime":   {{from: ms(2900), at: ms(2900)}},
		"refused":  {{from: ms(3000), at: ms(3000)}},
		"late":     {{from: ms(4000), at: ms(4000)}}, // arrives 50 ms late
		"jittered": {{from: ms(4100), at: ms(4100)}},
		"ahead":    {{from: ms(6000), at: ms(6020)}}, // left early, from its send_from
	}}
	arrive := func(id string, at time.Time, admitted bool, limit string) sim.Arrival {
		return sim.Arrival{Model: "m", JobID: id, At: at, Admitted: admitted, Limit: limit}
	}
	seen := []sim.Arrival{
		arrive("early", ms(100), true, ""),
		arrive("intime", ms(2905), true, ""),
		arrive("refused", ms(3005), false, "requests_short_window"),
		arrive("late", ms(4050), true, ""),
		arrive("jittered", ms(4105), false, "requests_short_window"),
		arrive("ahead", ms(6001), false, "requests_short_window"),
	}
	r := ReportArrivals(seen, plans, tol)
	if len(r.Refusals) != 3 {
		t.Fatalf("got %d refusals, want 3", len(r.Refusals))
	}
	for _, c := range []struct {
		id     string
		jitter bool
	}{{"refused", false}, {"jittered", true}, {"ahead", false}} {
		var f *Refusal
		for i := range r.Refusals {
			if r.Refusals[i].a.JobID == c.id {
				f = &r.Refusals[i]
			}
		}
		if f == nil || !f.ok {
			t.Fatalf("refusal of %s: none with a plan (%+v)", c.id, f)
		}
		if got := f.jitter != nil; got != c.jitter {
			t.Errorf("refusal of %s put down to jitter: %v, want %v (%s)", c.id, got, c.jitter, f.Describe(tol))
		}
	}
	if r.late != 2 {
		t.Errorf("%d arrivals late, want 2 (early and late)", r.late)
	}
}
