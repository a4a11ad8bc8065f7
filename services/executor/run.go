package executor

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Run consumes every model's DISPATCH subject until ctx ends, then lets
// calls in progress finish (bounded by their own timeouts).
func (s *Service) Run(ctx context.Context) error {
	if s.guard == nil {
		key, err := guard.LoadKey(ctx, s.mesh.Fleet)
		if err != nil {
			return err
		}
		s.guard = guard.NewLive(s.live, key)
	}
	var wg sync.WaitGroup
	var calls callGroup
	// Leases are returned after the calls in flight end.
	leaseCtx, stopLeases := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLeases()
	next := s.nextReload() // reloads from here on: followReloads
	models := &modelLoops{by: map[string]*modelLoop{}}
	stop := models.stop
	if err := s.syncModels(ctx, leaseCtx, &wg, &calls, models); err != nil {
		stop()
		return err
	}
	// Streaming callers that go away ask for their call to stop; every
	// executor hears it, the one running the job stops it.
	cancelSub, err := s.mesh.JS.Conn().Subscribe(job.CancelPrefix+">", s.str.onCancel)
	if err != nil {
		stop()
		return fmt.Errorf("subscribe %s>: %w", job.CancelPrefix, err)
	}
	defer func() { _ = cancelSub.Unsubscribe() }()
	whySub, err := s.mesh.JS.Conn().Subscribe(mesh.ExecutorWhySubjectPrefix+"*.*", s.waits.onWhy)
	if err != nil {
		stop()
		return fmt.Errorf("subscribe %s: %w", mesh.ExecutorWhySubjectPrefix, err)
	}
	defer func() { _ = whySub.Unsubscribe() }()
	startPool := func(tp *budget.Pool) {
		wg.Go(func() { tp.Run(leaseCtx, func(err error) { s.m.BudgetErrors.Inc() }) })
	}
	s.pools.each(startPool)
	wg.Go(func() {
		s.followReloads(ctx, next, func() {
			s.pools.syncTenantPools(startPool)
			if err := s.syncModels(ctx, leaseCtx, &wg, &calls, models); err != nil {
				s.log.Error("reload: could not consume a new deployment's jobs", "err", err)
			}
		})
	})
	wg.Go(func() { s.transits.reportTransits(ctx) })
	if o := s.store.Owners; o != nil {
		wg.Go(func() { _ = o.Run(leaseCtx) })
	}
	<-ctx.Done()
	stop()
	calls.close()
	stopLeases()
	wg.Wait()
	return nil
}

// callGroup counts the calls in progress. Consume callbacks may still run
// after ctx ends; a call starts only while the service is not closing, so
// Add never races Wait.
type callGroup struct {
	mu      sync.Mutex
	closing bool
	wg      sync.WaitGroup
}

// start counts a call about to start; false: the service is closing.
func (g *callGroup) start() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return false
	}
	g.wg.Add(1)
	return true
}

func (g *callGroup) done() { g.wg.Done() }

// close refuses new calls and waits for those in progress.
func (g *callGroup) close() {
	g.mu.Lock()
	g.closing = true
	g.mu.Unlock()
	g.wg.Wait()
}

// consumeModel consumes the DISPATCH subject of provider's model m: each
// job is verified and run with one of the model's concurrency slots, from
// a lease on the fleet-wide limit (internal/budget Pool) kept until
// leaseCtx ends.
func (s *Service) consumeModel(ctx, leaseCtx context.Context, wg *sync.WaitGroup, calls *callGroup, provider string, m *config.Model) (*modelLoop, error) {
	// Slots are taken just before the call and given back when it ends.
	pool := budget.NewPool(s.mesh.Budgets, budget.ConcKey(provider, job.ModelToken(m.Name)), s.holder, m.MaxConcurrency, 10*time.Second, s.now)
	labels := []string{provider, m.Name}
	mc := &modelCalls{s: s, ctx: ctx, pool: pool, labels: labels, calls: calls, workers: mesh.NewWorkers(ctx),
		// Calls outlive ctx by a grace period so a shutdown does not cut
		// responses the provider is already billing for.
		callCtx: context.WithoutCancel(ctx)}
	name := keys.DispatchConsumer(provider, job.ModelToken(m.Name))
	// The handler runs on the consume goroutine and hands each call off
	// (take): it blocks there only while it waits for a slot.
	l, err := s.mesh.Consume(ctx, mesh.Consumer{Stream: streams.Dispatch, Template: "executor", Name: name,
		Filter: job.DispatchSubject(provider, m.Name), What: name, Batch: max(2, m.MaxConcurrency), Middleware: []mesh.Middleware{s.poison().Middleware},
		Restarted: s.m.ConsumeRestarted(streams.Dispatch)}, s.log, mc.take)
	if err != nil {
		return nil, err
	}
	wg.Go(func() {
		pool.Run(leaseCtx, func(err error) {
			s.m.BudgetErrors.Inc()
			s.log.Warn("concurrency lease", "provider", labels[0], "model", labels[1], "err", err)
		})
	})
	return &modelLoop{loop: l, pool: pool}, nil
}

// modelCalls starts the calls of one model's dispatched jobs.
type modelCalls struct {
	s       *Service
	ctx     context.Context // the service's: ends at shutdown
	callCtx context.Context // the calls': outlives ctx
	pool    *budget.Pool
	labels  []string
	calls   *callGroup
	workers *mesh.Workers // the calls run on (nil: a goroutine each)
}

// take handles one dispatched message: a paced call is checked at once
// and waits for its instant without a slot; any other waits here for a
// slot first. What it does not hand off it settles at once.
func (mc *modelCalls) take(_ context.Context, msg jetstream.Msg) error {
	if _, err := mc.start(msg); err != nil {
		return decided(err)
	}
	return mesh.ErrKept
}

// start hands msg's job off to a worker, which settles the message when
// it is done; an error says it was not handed off.
func (mc *modelCalls) start(msg jetstream.Msg) (*task.Task, error) {
	s := mc.s
	// Decoded once, here: the envelope carries the request, and a large
	// one is the costliest thing an executor parses.
	j, err := mesh.DecodeTask(msg)
	if err != nil {
		return nil, err
	}
	if r := j.Reservation; r != nil && !r.SendAt.IsZero() {
		s.epochs.warmEpoch(mc.ctx, j, mc.calls.start, mc.calls.done)
		// A paced call: it is checked now, while it waits for its instant
		// without a slot (admission plans at most plan_horizon ahead, which
		// bounds how many wait), takes one just before, and goes back to
		// admission if none frees in time. Checking first keeps the work
		// between waking and sending small: a large request verified after
		// waking missed its send tolerance on a loaded machine every time,
		// and was planned again for ever.
		if !mc.calls.start() {
			return j, redeliverAfter(time.Second)
		}
		mc.workers.Go(func() {
			defer mc.calls.done()
			s.acknowledge(msg, j, s.verifyThenRun(mc.callCtx, msg, j, func() (context.Context, func(), error) { return mc.slotAtInstant(j) }))
		})
		return j, nil
	}
	// Wait here for a slot: the consumer buffers at most max_concurrency
	// jobs, so a slow provider backs up DISPATCH, not this process's memory.
	forget := s.waits.noteWait(j.Key(), "model_concurrency", time.Time{})
	err = mc.pool.Acquire(mc.ctx)
	forget()
	if err != nil {
		return j, redeliverAfter(time.Second)
	}
	held, _ := mc.pool.Held()
	s.m.ConcLeased.WithLabelValues(mc.labels...).Set(float64(held))
	if !mc.calls.start() {
		mc.pool.Release()
		return j, redeliverAfter(time.Second)
	}
	mc.workers.Go(func() {
		defer mc.calls.done()
		defer mc.pool.Release()
		s.acknowledge(msg, j, s.verifyThenRun(mc.callCtx, msg, j, nil))
	})
	return j, nil
}

// slotAtInstant waits until just before a paced call's instant and takes
// a slot for it, waiting for one at most until the reservation lapses.
// It returns the context to run the call in and what releases the slot,
// or a redelivery when the service shut down.
func (mc *modelCalls) slotAtInstant(j *task.Task) (context.Context, func(), error) {
	s, r := mc.s, j.Reservation
	waitFrom := s.now()
	forget := s.waits.noteWait(j.Key(), "send_at", r.Earliest())
	defer forget()
	wakeAt := r.Earliest().Add(-s.transits.wakeAhead(waitFrom))
	if !sleepUntil(mc.ctx, wakeAt) {
		return nil, nil, redeliverAfter(time.Second)
	}
	waited := s.now().Sub(waitFrom)
	s.waits.noteWait(j.Key(), "model_concurrency", time.Time{})
	actx, cancel := context.WithDeadline(mc.ctx, r.ValidUntil)
	err := mc.pool.Acquire(actx)
	cancel()
	if err != nil && mc.ctx.Err() != nil {
		return nil, nil, redeliverAfter(time.Second)
	}
	release := func() {}
	if err == nil {
		release = mc.pool.Release
	}
	// Without a slot by ValidUntil, execute finds the reservation lapsed
	// and re-admits the job.
	return withWoke(withWaited(mc.callCtx, waited), later(waitFrom, wakeAt)), release, nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// verifyThenRun verifies a dispatched job and runs it; its error says how
// the message is settled (acknowledge). slot, when not nil, is called
// after the verification to take the job's concurrency slot: it returns
// the context to run in and the slot's release.
func (s *Service) verifyThenRun(ctx context.Context, msg jetstream.Msg, j *task.Task, slot func() (context.Context, func(), error)) error {
	if err := s.verify(ctx, msg, j); err != nil {
		return err
	}
	if slot != nil {
		runCtx, release, err := slot()
		if err != nil {
			return err
		}
		defer release()
		ctx = runCtx
	}
	return s.run(ctx, msg, j)
}
