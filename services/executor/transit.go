package executor

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/task"
)

// A paced call's transit runs from the moment admission planned it
// (Reservation.ReservedAt) to the moment this executor is ready to send it
// (verified, slot held, operation marked in flight), less the time it
// waited on purpose for its instant. Executors report their transits to
// every admission process (mesh.TransitSubject), which plans each call
// only as far ahead as the transits call for (budget.LeadEstimator).

// transitEvery is how often transits are reported.
const transitEvery = 100 * time.Millisecond

// maxPending bounds the transits held between reports.
const maxPending = 256

// transits owns the paced calls' dispatch transits this process
// measured and reports.
type transits struct {
	*env
	mu sync.Mutex
	ds []time.Duration
	// wake learns how long before its instant a paced call must wake to
	// be ready by it (wakeAhead).
	wake *budget.LeadEstimator
}

// A paced call sleeps until shortly before its instant, then takes its
// slot, marks its operation in flight (a replicated write) and is ready:
// on a starved machine that took 45-290 ms, and a call that woke a fixed
// 10 ms ahead lapsed and was planned again, which starved the machine
// further. So the executor wakes as far ahead as its own wake-to-ready
// times call for: the median on time, the slowest 1 % late by at most a
// third of the send tolerance, within [slotAhead, maxWakeAhead], slotAhead
// until 16 are known. Waking early only holds the call's slot longer.

// maxWakeAhead bounds how early a paced call wakes.
const maxWakeAhead = time.Second

func newWake(tolerance time.Duration) *budget.LeadEstimator {
	e := budget.NewLeadEstimator(slotAhead, maxWakeAhead, tolerance/3)
	e.Untrusted = slotAhead
	return e
}

// wakeAhead is how long before its instant a paced call wakes at now.
func (t *transits) wakeAhead(now time.Time) time.Duration {
	if t.wake == nil {
		return slotAhead
	}
	return t.wake.Lead(now)
}

type wokeKey struct{}

// withWoke records in ctx when a paced call woke (or arrived, if after).
func withWoke(ctx context.Context, at time.Time) context.Context {
	return context.WithValue(ctx, wokeKey{}, at)
}

// noteWoke learns a paced call's wake-to-ready time, at ready.
func (t *transits) noteWoke(ctx context.Context) {
	if at, ok := ctx.Value(wokeKey{}).(time.Time); ok && t.wake != nil {
		now := t.now()
		t.wake.Observe(now, now.Sub(at))
	}
}

func (t *transits) add(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ds) < maxPending {
		t.ds = append(t.ds, d)
	}
}

func (t *transits) take() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	ds := t.ds
	t.ds = nil
	return ds
}

// reportTransits publishes the transits seen, every transitEvery, until
// ctx ends.
func (s *transits) reportTransits(ctx context.Context) {
	t := time.NewTicker(transitEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if ds := s.take(); len(ds) > 0 {
				if err := s.mesh.PublishTransits(ds); err != nil {
					s.log.Debug("report transits", "err", err)
				}
			}
		}
	}
}

type waitedKey struct{}

// withWaited records in ctx how long a paced call waited on purpose before
// execute (for its slot's time), which is not transit.
func withWaited(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, waitedKey{}, d)
}

// noteReady records the transit of a paced call that is ready to send:
// only on the dispatch's first delivery (a redelivery's includes an ack
// wait, not transit).
func (s *transits) noteReady(ctx context.Context, msg jetstream.Msg, j *task.Task) {
	r := j.Reservation
	if r == nil || r.SendAt.IsZero() || r.ReservedAt.IsZero() {
		return
	}
	if md, err := msg.Metadata(); err != nil || md.NumDelivered > 1 {
		return
	}
	waited, _ := ctx.Value(waitedKey{}).(time.Duration)
	s.add(s.now().Sub(r.ReservedAt) - waited)
}
