package executor

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
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

type transits struct {
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
func (s *Service) reportTransits(ctx context.Context) {
	t := time.NewTicker(transitEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if ds := s.transits.take(); len(ds) > 0 {
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
func (s *Service) noteReady(ctx context.Context, msg jetstream.Msg, j *task.Task) {
	r := j.Reservation
	if r == nil || r.SendAt.IsZero() || r.ReservedAt.IsZero() {
		return
	}
	if md, err := msg.Metadata(); err != nil || md.NumDelivered > 1 {
		return
	}
	waited, _ := ctx.Value(waitedKey{}).(time.Duration)
	s.transits.add(s.now().Sub(r.ReservedAt) - waited)
}

// warmEpoch reads the model's last cut now, in the background, when the
// view drained consults before the call would be stale by its instant:
// the read is then done while the call crosses to its executor, not on
// its transit (which the lead of every paced call is learned from). One
// read per model at a time; drained still reads itself a view it finds
// stale. The read is counted among the service's calls (start, done).
func (s *Service) warmEpoch(ctx context.Context, j *task.Task, start func() bool, done func()) {
	key := adapt.Key(j.Provider, job.ModelToken(j.Model))
	s.epochMu.Lock()
	v := s.epochs[key]
	s.epochMu.Unlock()
	if j.Reservation.SendAt.Sub(v.read) < epochRefresh {
		return
	}
	busy, _ := s.warming.LoadOrStore(key, new(atomic.Bool))
	if !busy.(*atomic.Bool).CompareAndSwap(false, true) {
		return
	}
	if !start() {
		busy.(*atomic.Bool).Store(false)
		return
	}
	go func() {
		defer done()
		defer busy.(*atomic.Bool).Store(false)
		_, _ = s.readEpoch(ctx, key, s.now())
	}()
}
