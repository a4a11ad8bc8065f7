package executor

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
