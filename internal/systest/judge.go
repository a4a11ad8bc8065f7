package systest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// Judged collects what the simulator's limits judged (sim.Config.OnArrival).
type Judged struct {
	mu   sync.Mutex
	list []sim.Arrival
}

func (a *Judged) Add(x sim.Arrival) {
	a.mu.Lock()
	a.list = append(a.list, x)
	a.mu.Unlock()
}

func (a *Judged) All() []sim.Arrival {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.list)
}

// Plans records the send windows admission planned, per job, as read from
// every message published to DISPATCH.
type Plans struct {
	mu  sync.Mutex
	at  map[string][]plan
	bad int
}

// plan is one reservation's send window: the call may leave from its
// instant (or from, when the schedule had room for it earlier) until the
// tolerance after it.
type plan struct{ from, at time.Time }

// WatchPlans subscribes to DISPATCH's subjects until the test ends.
func WatchPlans(t testing.TB, nc *nats.Conn) *Plans {
	t.Helper()
	p := &Plans{at: map[string][]plan{}}
	sub, err := nc.Subscribe(job.DispatchPrefix+">", func(m *nats.Msg) {
		var j task.Task
		p.mu.Lock()
		defer p.mu.Unlock()
		if json.Unmarshal(m.Data, &j) != nil || j.Reservation == nil {
			p.bad++
			return
		}
		if r := j.Reservation; !r.SendAt.IsZero() {
			p.at[j.ID] = append(p.at[j.ID], plan{from: r.Earliest(), at: r.SendAt})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return p
}

// lateness is how long after its planned instant the provider saw arrival
// a (negative: it left early, where the schedule had room), by the latest
// plan whose window opened before it; false if none did.
func (p *Plans) lateness(a sim.Arrival) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best plan
	for _, s := range p.at[a.JobID] {
		if !s.from.After(a.At) && s.from.After(best.from) {
			best = s
		}
	}
	if best.from.IsZero() {
		return 0, false
	}
	return a.At.Sub(best.at), true
}

// ArrivalReport is the provider's view set against the plan.
type ArrivalReport struct {
	lateness []time.Duration // of every arrival with a planned instant, sorted
	late     int             // of those, later than the tolerance
	Refusals []Refusal
	bad      int // unreadable DISPATCH messages
}

// Refusal is one request the provider refused, with its lateness (ok:
// it had a planned instant) and, if one of the calls its window held
// arrived later than the tolerance, the latest of them (jitter).
type Refusal struct {
	a      sim.Arrival
	late   time.Duration
	ok     bool
	jitter *sim.Arrival
	jlate  time.Duration
}

// refusalWindow is the window a refusal by limit was judged over: the
// second for the per-second quantum, else the minute (a unit's refusal
// names the unit only, so it is given the longer one).
func refusalWindow(limit string) time.Duration {
	if strings.HasSuffix(limit, "_short_window") {
		return time.Second
	}
	return time.Minute
}

// ReportArrivals sets what the provider saw against the plan. A refusal is
// put down to jitter only if a call in the window that refused it (itself
// included) reached the provider later than the tolerance after its
// instant: the plan holds every window whose calls all arrive in time.
func ReportArrivals(seen []sim.Arrival, p *Plans, tolerance time.Duration) ArrivalReport {
	var r ArrivalReport
	type lateCall struct {
		a    sim.Arrival
		late time.Duration
	}
	var late []lateCall
	for _, a := range seen {
		if d, ok := p.lateness(a); ok && d > tolerance {
			late = append(late, lateCall{a, d})
		}
	}
	for _, a := range seen {
		d, ok := p.lateness(a)
		if ok {
			r.lateness = append(r.lateness, d)
			if d > tolerance {
				r.late++
			}
		}
		if a.Admitted {
			continue
		}
		f := Refusal{a: a, late: d, ok: ok}
		w := refusalWindow(a.Limit)
		for _, l := range late {
			if l.a.Model == a.Model && l.a.At.After(a.At.Add(-w)) && !l.a.At.After(a.At) && (f.jitter == nil || l.a.At.After(f.jitter.At)) {
				f.jitter, f.jlate = &l.a, l.late
			}
		}
		r.Refusals = append(r.Refusals, f)
	}
	slices.Sort(r.lateness)
	p.mu.Lock()
	r.bad = p.bad
	p.mu.Unlock()
	return r
}

// Summary is one line of lateness figures.
func (r ArrivalReport) Summary(tolerance time.Duration, arrivals int) string {
	if len(r.lateness) == 0 {
		return fmt.Sprintf("no arrival matched a planned instant (%d arrivals)", arrivals)
	}
	q := func(f float64) time.Duration { return r.lateness[int(f*float64(len(r.lateness)-1))] }
	return fmt.Sprintf("arrival after the planned instant: p50 %s, p99 %s, max %s; %d of %d later than the %s tolerance (%d arrivals unmatched)",
		q(0.5), q(0.99), r.lateness[len(r.lateness)-1], r.late, len(r.lateness), tolerance, arrivals-len(r.lateness))
}

// Describe says of a refusal whether the plan or the transit is to blame.
func (f Refusal) Describe(tolerance time.Duration) string {
	switch {
	case !f.ok:
		return fmt.Sprintf("provider refused job %s (%s) at %s, and no instant was planned for it before then", f.a.JobID, f.a.Limit, f.a.At.Format(time.RFC3339Nano))
	case f.late > tolerance:
		return fmt.Sprintf("provider refused job %s (%s): it arrived %s after its planned instant, later than the %s tolerance: it was delivered late", f.a.JobID, f.a.Limit, f.late, tolerance)
	case f.jitter != nil:
		return fmt.Sprintf("provider refused job %s (%s): it arrived %s after its planned instant, but job %s arrived %s after its own, later than the %s tolerance, %s before it: delivered late",
			f.a.JobID, f.a.Limit, f.late, f.jitter.JobID, f.jlate, tolerance, f.a.At.Sub(f.jitter.At))
	}
	return fmt.Sprintf("provider refused job %s (%s): it and every call in its window arrived within the %s tolerance (it %s after its planned instant), so the plan overfilled", f.a.JobID, f.a.Limit, tolerance, f.late)
}

// JudgeArrivals holds the provider's view to the plan's promise: a window
// whose calls all reach the provider within tolerance of their planned
// instants never refuses one. It fails on a refusal whose window held only
// calls in time; one whose window held a call delivered late (the machine
// was too busy to deliver it at its instant: a late call shares the second
// of the calls after it) says nothing about the plan and is logged, with
// the lateness figures. A refusal of a call without a planned instant
// always fails; refusals must match the simulator's count. The plan itself
// is held to a strict provider by internal/budget's property tests.
func JudgeArrivals(t testing.TB, seen []sim.Arrival, p *Plans, tolerance time.Duration, refused int64) {
	t.Helper()
	r := ReportArrivals(seen, p, tolerance)
	// The simulator counts tokens its own way (as providers do), so a call
	// may carry a few more than Sluice reserved: the token estimate's error,
	// which the promise bounds at 0.5 % of calls refused, not at none.
	tokenRefusals, tokenBound := 0, max(1, len(seen)/200)
	for _, f := range r.Refusals {
		if f.ok && strings.Contains(f.a.Limit, "token") {
			tokenRefusals++
		}
	}
	for _, f := range r.Refusals {
		switch {
		case f.ok && f.jitter != nil:
			t.Log(f.Describe(tolerance))
		case f.ok && strings.Contains(f.a.Limit, "token") && tokenRefusals <= tokenBound:
			t.Log(f.Describe(tolerance) + " (within the token estimate's error bound)")
		default:
			t.Error(f.Describe(tolerance))
		}
	}
	if int64(len(r.Refusals)) != refused {
		t.Errorf("the arrival hook saw %d refusals, the simulator counted %d", len(r.Refusals), refused)
	}
	if r.bad != 0 {
		t.Errorf("%d DISPATCH messages without a reservation or unreadable", r.bad)
	}
	if len(r.lateness) == 0 {
		t.Error(r.Summary(tolerance, len(seen)))
		return
	}
	t.Log(r.Summary(tolerance, len(seen)))
	if r.late > 0 {
		t.Logf("%d of %d calls arrived later than the %s tolerance: this run cannot show the plan holds", r.late, len(r.lateness), tolerance)
	}
}
