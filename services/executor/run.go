package executor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/keys"
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
		s.guard = guard.New(s.cfg.App, key)
	}
	var wg sync.WaitGroup
	var calls callGroup
	// Leases are returned after the calls in flight end.
	leaseCtx, stopLeases := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLeases()
	var ccs []jetstream.ConsumeContext
	for _, p := range s.cfg.App.Providers {
		for i := range p.Models {
			cc, err := s.consumeModel(ctx, leaseCtx, &wg, &calls, p.Name, &p.Models[i])
			if err != nil {
				for _, cc := range ccs {
					cc.Stop()
				}
				return err
			}
			ccs = append(ccs, cc)
		}
	}
	// Streaming callers that go away ask for their call to stop; every
	// executor hears it, the one running the job stops it.
	cancelSub, err := s.mesh.JS.Conn().Subscribe(job.CancelPrefix+">", s.onCancel)
	if err != nil {
		for _, cc := range ccs {
			cc.Stop()
		}
		return fmt.Errorf("subscribe %s>: %w", job.CancelPrefix, err)
	}
	defer func() { _ = cancelSub.Unsubscribe() }()
	for _, t := range s.cfg.App.Tenants {
		if t.MaxConcurrency <= 0 {
			continue
		}
		tp := s.tenantPools[t.Name]
		wg.Go(func() { tp.Run(leaseCtx, func(err error) { s.m.BudgetErrors.Inc() }) })
	}
	wg.Go(func() { s.reportTransits(ctx) })
	<-ctx.Done()
	for _, cc := range ccs {
		cc.Stop()
	}
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
func (s *Service) consumeModel(ctx, leaseCtx context.Context, wg *sync.WaitGroup, calls *callGroup, provider string, m *config.Model) (jetstream.ConsumeContext, error) {
	name := keys.DispatchConsumer(provider, job.ModelToken(m.Name))
	cons, err := streams.EnsureConsumer(ctx, s.mesh.JS, streams.Dispatch, "executor", name, job.DispatchSubject(provider, m.Name))
	if err != nil {
		return nil, err
	}
	// Slots are taken just before the call and given back when it ends.
	pool := budget.NewPool(s.mesh.Budgets, budget.ConcKey(provider, job.ModelToken(m.Name)), s.holder, m.MaxConcurrency, 10*time.Second, s.now)
	labels := []string{provider, m.Name}
	wg.Go(func() {
		pool.Run(leaseCtx, func(err error) {
			s.m.BudgetErrors.Inc()
			s.log.Warn("concurrency lease", "provider", labels[0], "model", labels[1], "err", err)
		})
	})
	mc := &modelCalls{s: s, ctx: ctx, pool: pool, labels: labels, calls: calls,
		// Calls outlive ctx by a grace period so a shutdown does not cut
		// responses the provider is already billing for.
		callCtx: context.WithoutCancel(ctx)}
	cc, err := cons.Consume(mc.take, jetstream.PullMaxMessages(max(2, m.MaxConcurrency)), streams.PullExpiry(),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, jetstream.ErrNoHeartbeat) {
				s.log.Debug("dispatch consume", "err", err)
			}
		}))
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", name, err)
	}
	return cc, nil
}

// modelCalls starts the calls of one model's dispatched jobs.
type modelCalls struct {
	s       *Service
	ctx     context.Context // the service's: ends at shutdown
	callCtx context.Context // the calls': outlives ctx
	pool    *budget.Pool
	labels  []string
	calls   *callGroup
}

// take handles one dispatched message: a paced call is checked at once
// and waits for its instant without a slot; any other waits here for a
// slot first.
func (mc *modelCalls) take(msg jetstream.Msg) {
	s := mc.s
	// Decoded once, here: the envelope carries the request, and a large
	// one is the costliest thing an executor parses.
	j, ok := s.decode(msg)
	if !ok {
		return
	}
	if r := j.Reservation; r != nil && !r.SendAt.IsZero() {
		s.warmEpoch(mc.ctx, j, mc.calls.start, mc.calls.done) // transit.go
		// A paced call: it is checked now, while it waits for its instant
		// without a slot (admission plans at most plan_horizon ahead, which
		// bounds how many wait), takes one just before, and goes back to
		// admission if none frees in time. Checking first keeps the work
		// between waking and sending small: a large request verified after
		// waking missed its send tolerance on a loaded machine every time,
		// and was planned again for ever.
		if !mc.calls.start() {
			_ = msg.NakWithDelay(time.Second)
			return
		}
		go func() {
			defer mc.calls.done()
			s.verifyThenRun(mc.callCtx, msg, j, func() (context.Context, func(), bool) { return mc.slotAtInstant(msg, j) })
		}()
		return
	}
	// Wait here for a slot: the consumer buffers at most max_concurrency
	// jobs, so a slow provider backs up DISPATCH, not this process's memory.
	if err := mc.pool.Acquire(mc.ctx); err != nil {
		_ = msg.NakWithDelay(time.Second)
		return
	}
	held, _ := mc.pool.Held()
	s.m.ConcLeased.WithLabelValues(mc.labels...).Set(float64(held))
	if !mc.calls.start() {
		mc.pool.Release()
		_ = msg.NakWithDelay(time.Second)
		return
	}
	go func() {
		defer mc.calls.done()
		defer mc.pool.Release()
		s.verifyThenRun(mc.callCtx, msg, j, nil)
	}()
}

// slotAtInstant waits until just before a paced call's instant and takes
// a slot for it, waiting for one at most until the reservation lapses.
// It returns the context to run the call in and what releases the slot;
// false when the service shut down (the message is then sent back).
func (mc *modelCalls) slotAtInstant(msg jetstream.Msg, j *job.Job) (context.Context, func(), bool) {
	s, r := mc.s, j.Reservation
	waitFrom := s.now()
	if !sleepUntil(mc.ctx, r.SendAt.Add(-slotAhead)) {
		_ = msg.NakWithDelay(time.Second)
		return nil, nil, false
	}
	waited := s.now().Sub(waitFrom)
	actx, cancel := context.WithDeadline(mc.ctx, r.ValidUntil)
	err := mc.pool.Acquire(actx)
	cancel()
	if err != nil && mc.ctx.Err() != nil {
		_ = msg.NakWithDelay(time.Second)
		return nil, nil, false
	}
	release := func() {}
	if err == nil {
		release = mc.pool.Release
	}
	// Without a slot by ValidUntil, execute finds the reservation lapsed
	// and re-admits the job.
	return withWaited(mc.callCtx, waited), release, true
}

// verifyThenRun verifies a dispatched job and runs it. slot, when not
// nil, is called after the verification to take the job's concurrency
// slot: it returns the context to run in and the slot's release, or false
// when it settled the message itself.
func (s *Service) verifyThenRun(ctx context.Context, msg jetstream.Msg, j *job.Job, slot func() (context.Context, func(), bool)) {
	if err := s.verify(ctx, msg, j); err != nil {
		s.unverified(msg, j, err)
		return
	}
	if slot != nil {
		runCtx, release, ok := slot()
		if !ok {
			return
		}
		defer release()
		ctx = runCtx
	}
	s.run(ctx, msg, j)
}
