package main

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// judged collects what the simulator's limits judged (sim.Config.OnArrival).
type judged struct {
	mu   sync.Mutex
	list []sim.Arrival
}

func (a *judged) add(x sim.Arrival) {
	a.mu.Lock()
	a.list = append(a.list, x)
	a.mu.Unlock()
}

func (a *judged) all() []sim.Arrival {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.list)
}

// plans records the send instants admission planned, per job, as read from
// every message published to DISPATCH.
type plans struct {
	mu  sync.Mutex
	at  map[string][]time.Time
	bad int
}

// watchPlans subscribes to DISPATCH's subjects until the test ends.
func watchPlans(t testing.TB, nc *nats.Conn) *plans {
	t.Helper()
	p := &plans{at: map[string][]time.Time{}}
	sub, err := nc.Subscribe(job.DispatchPrefix+">", func(m *nats.Msg) {
		var j job.Job
		p.mu.Lock()
		defer p.mu.Unlock()
		if json.Unmarshal(m.Data, &j) != nil || j.Reservation == nil {
			p.bad++
			return
		}
		if !j.Reservation.SendAt.IsZero() {
			p.at[j.ID] = append(p.at[j.ID], j.Reservation.SendAt)
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

// lateness is how long after its latest planned instant before it the
// provider saw arrival a; false if no instant was planned before it.
func (p *plans) lateness(a sim.Arrival) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best time.Time
	for _, s := range p.at[a.JobID] {
		if !s.After(a.At) && s.After(best) {
			best = s
		}
	}
	if best.IsZero() {
		return 0, false
	}
	return a.At.Sub(best), true
}

// judgeArrivals holds the provider's view to the plan's promise: a call that
// reaches the provider within tolerance of its planned instant is never
// refused. It fails on a refusal of a call that arrived in time or that
// had no planned instant, and if more than 2% of the calls arrived later
// than tolerance (then the run says little about the plan). It logs the
// lateness figures; refusals must match the simulator's count.
func judgeArrivals(t *testing.T, seen []sim.Arrival, p *plans, tolerance time.Duration, refused int64) {
	t.Helper()
	var late []time.Duration
	var all []time.Duration
	var refusals int64
	for _, a := range seen {
		d, ok := p.lateness(a)
		if ok {
			all = append(all, d)
			if d > tolerance {
				late = append(late, d)
			}
		}
		if a.Admitted {
			continue
		}
		refusals++
		switch {
		case !ok:
			t.Errorf("provider refused job %s (%s) at %s, and no instant was planned for it before then", a.JobID, a.Limit, a.At.Format(time.RFC3339Nano))
		case d <= tolerance:
			t.Errorf("provider refused job %s (%s): it arrived %s after its planned instant, within the %s tolerance, so the plan overfilled", a.JobID, a.Limit, d, tolerance)
		default:
			t.Logf("provider refused job %s (%s): it arrived %s after its planned instant, later than the %s tolerance: this process delivered it late", a.JobID, a.Limit, d, tolerance)
		}
	}
	if refusals != refused {
		t.Errorf("the arrival hook saw %d refusals, the simulator counted %d", refusals, refused)
	}
	p.mu.Lock()
	bad := p.bad
	p.mu.Unlock()
	if bad != 0 {
		t.Errorf("%d DISPATCH messages without a reservation or unreadable", bad)
	}
	if len(all) == 0 {
		t.Errorf("no arrival matched a planned instant (%d arrivals)", len(seen))
		return
	}
	slices.Sort(all)
	q := func(f float64) time.Duration { return all[int(f*float64(len(all)-1))] }
	t.Logf("arrival after the planned instant: p50 %s, p99 %s, max %s; %d of %d later than the %s tolerance (%d arrivals unmatched)",
		q(0.5), q(0.99), all[len(all)-1], len(late), len(all), tolerance, len(seen)-len(all))
	if 50*len(late) > len(all) {
		t.Errorf("%d of %d calls arrived later than the %s tolerance: the run cannot show the plan holds", len(late), len(all), tolerance)
	}
}
