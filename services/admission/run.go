package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Run consumes QUEUE until ctx ends.
func (s *Service) Run(ctx context.Context) (err error) {
	if s.guard == nil {
		key, err := guard.LoadKey(ctx, s.mesh.Fleet)
		if err != nil {
			return err
		}
		s.guard = guard.NewLive(s.live, key)
	}
	defer s.recoverScheduler(&err)
	in, stop, err := s.consumeQueue(ctx)
	if err != nil {
		return err
	}
	defer stop()
	sig, unsubscribe, err := s.listen(ctx)
	if err != nil {
		return err
	}
	defer unsubscribe()
	var wg sync.WaitGroup
	defer wg.Wait()
	bg, stopBG := context.WithCancel(ctx)
	defer stopBG() // before the wait, even when the scheduler fails
	wg.Go(func() { s.placer.affinity.run(bg) })
	wg.Go(func() { s.placer.watchDeployments(bg) })
	if o := s.store.Owners; o != nil {
		wg.Go(func() { _ = o.Run(bg) })
	}
	s.schedule(ctx, in, sig)
	return nil
}

// recoverScheduler, deferred by Run: a scheduler that fails must not hang
// with /readyz green. The process ends (and its supervisor restarts it);
// QUEUE keeps every job it held, unacknowledged.
func (s *Service) recoverScheduler(err *error) {
	if p := recover(); p != nil {
		s.log.Error("admission: scheduler failed", "panic", p, "stack", string(debug.Stack()))
		s.failed.Store(fmt.Sprint(p))
		*err = fmt.Errorf("scheduler failed: %v", p)
	}
}

// consumeQueue pulls QUEUE into in, each tenant's jobs through its own
// consumer (queueTakers), up to a batch ahead of the scheduler, and
// watches QUEUE's depth. stop drains the consumers and sends back what was
// pulled and not taken.
func (s *Service) consumeQueue(ctx context.Context) (in chan jetstream.Msg, stop func(), err error) {
	next := s.nextReload()
	q := &queueTakers{s: s, ctx: ctx, in: make(chan jetstream.Msg, s.app().Admission.Batch), quit: make(chan struct{}), loops: map[string]*mesh.Loop{}}
	if err := q.takeAll(s.app().Tenants); err != nil {
		q.stop()
		return nil, nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() { s.watchDepth(ctx) })
	wg.Go(func() { q.followReloads(next) })
	stop = func() {
		q.stop()
		wg.Wait()
	}
	return q.in, stop, nil
}

// queueTakers are this process's QUEUE consumers, one per tenant
// (keys.AdmissionConsumer, filter sluice.queue.*.<tenant>), which every
// admission process shares. Each has the tenant's window as its
// max_ack_pending (admission.tenant_window): JetStream delivers no more of
// a tenant's jobs while that many are taken and not finished with, held
// here or deferred by redelivery delay, so one tenant's waiting work can
// never hold back another's. All deliver into in, which the scheduler
// reads.
type queueTakers struct {
	s     *Service
	ctx   context.Context
	in    chan jetstream.Msg
	quit  chan struct{} // closed by stop
	mu    sync.Mutex
	loops map[string]*mesh.Loop // nil while being started
	done  bool
}

// takeStarts bounds how many tenants' consumers are made at once at start.
const takeStarts = 8

// takeAll takes each tenant's jobs, a few consumers made at a time.
func (q *queueTakers) takeAll(tenants []config.Tenant) error {
	errs := make([]error, len(tenants))
	sem := make(chan struct{}, takeStarts)
	var wg sync.WaitGroup
	for i, t := range tenants {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = q.take(t.Name)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// followReloads takes the jobs of tenants a reload adds, until the
// takers stop. A tenant a reload removes keeps its consumer until the
// process restarts: its jobs already queued are still placed (ingest
// takes no new ones).
func (q *queueTakers) followReloads(next <-chan struct{}) {
	for {
		select {
		case <-q.ctx.Done():
			return
		case <-q.quit:
			return
		case <-next:
			next = q.s.nextReload()
			if err := q.takeAll(q.s.app().Tenants); err != nil {
				q.s.log.Error("reload: could not take a new tenant's jobs", "err", err)
			}
		}
	}
}

// take starts taking tenant's jobs, its consumer made or updated first. A
// tenant taken already is left as it is, so it may be called again at any
// time while the service runs (for a tenant added later).
func (q *queueTakers) take(tenant string) error {
	if !job.ValidName(tenant) {
		return fmt.Errorf("take QUEUE of tenant %q: not a tenant name", tenant)
	}
	q.mu.Lock()
	_, started := q.loops[tenant]
	if started || q.done {
		q.mu.Unlock()
		return nil
	}
	q.loops[tenant] = nil
	q.mu.Unlock()
	loop, err := q.s.mesh.Consume(q.ctx, q.s.tenantConsumer(tenant), q.s.log, q.deliver)
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case err != nil:
		delete(q.loops, tenant)
		return fmt.Errorf("take QUEUE of tenant %s: %w", tenant, err)
	case q.done: // stopped meanwhile
		loop.Stop()
	default:
		q.loops[tenant] = loop
	}
	return nil
}

// tenantConsumer is tenant's QUEUE consumer. A pull is at most a batch and
// a share of max_held_bytes (but room for the largest job), so the jobs
// pulled ahead stay bounded however many tenants there are.
func (s *Service) tenantConsumer(tenant string) mesh.Consumer {
	a := s.app().Admission
	share := a.MaxHeldBytes / max(len(s.app().Tenants), 1)
	return mesh.Consumer{Stream: streams.Queue, Template: "admission", What: "queue",
		Name: keys.AdmissionConsumer(tenant), Filter: job.QueuePrefix + "*." + tenant, MaxAckPending: a.TenantWindow,
		Batch: min(a.Batch, a.TenantWindow), BatchBytes: max(share, 2*s.app().Limits.JobMsgBytes()),
		Restarted: s.m.ConsumeRestarted(streams.Queue)}
}

// deliver hands a message to the scheduler, which settles it.
func (q *queueTakers) deliver(_ context.Context, msg jetstream.Msg) error {
	select {
	case q.in <- msg:
		return mesh.ErrKept
	case <-q.ctx.Done():
		// Shutting down: another admission process takes it now,
		// not after the ack wait.
		return mesh.Retry(0)
	case <-q.quit:
		return mesh.Retry(0)
	}
}

// stop drains every consumer at once, then sends back at once what was
// pulled and not handed over yet (deliver NAKs what comes once stopped),
// so a rolling restart does not hold up to a batch of jobs per tenant for
// the 30 s ack wait.
func (q *queueTakers) stop() {
	q.mu.Lock()
	if !q.done {
		q.done = true
		close(q.quit)
	}
	loops := make([]*mesh.Loop, 0, len(q.loops))
	for _, l := range q.loops {
		if l != nil {
			loops = append(loops, l)
		}
	}
	q.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Go(func() {
			if !l.Drain(2 * time.Second) {
				l.Stop()
			}
		})
	}
	wg.Wait()
	for {
		select {
		case m := <-q.in:
			_ = m.Nak()
			continue
		default:
		}
		return
	}
}

// signals are what other processes tell the scheduler: "why does this
// job wait", and which jobs their callers cancelled. (A provider's pause
// is health's: a cooling record, read through placer.next.)
type signals struct {
	whys    chan whyQuery
	cancels chan string // job keys their callers cancelled (cancel.go)
}

// listen subscribes to the signals and to the executors' transits
// (lead.go); unsubscribe ends the subscriptions.
func (s *Service) listen(ctx context.Context) (sig signals, unsubscribe func(), err error) {
	sig = signals{whys: make(chan whyQuery), cancels: make(chan string, 256)}
	var subs []*nats.Subscription
	unsubscribe = func() {
		for i := len(subs) - 1; i >= 0; i-- {
			_ = subs[i].Unsubscribe()
		}
	}
	nc := s.mesh.JS.Conn()
	wsub, err := nc.Subscribe(WhySubjectPrefix+"*.*", func(m *nats.Msg) { s.answerWhy(ctx, m, sig.whys) })
	if err != nil {
		return sig, nil, fmt.Errorf("subscribe why: %w", err)
	}
	subs = append(subs, wsub)
	csub, err := nc.Subscribe(mesh.CancelledSubjectPrefix+"*.*", func(m *nats.Msg) {
		select {
		case sig.cancels <- strings.TrimPrefix(m.Subject, mesh.CancelledSubjectPrefix):
		default: // the executors' check of the operation record still holds
		}
	})
	if err != nil {
		unsubscribe()
		return sig, nil, fmt.Errorf("subscribe cancels: %w", err)
	}
	subs = append(subs, csub)
	tsub, err := s.placer.watchTransits()
	if err != nil {
		unsubscribe()
		return sig, nil, fmt.Errorf("subscribe transits: %w", err)
	}
	subs = append(subs, tsub)
	return sig, unsubscribe, nil
}

// answerWhy asks the scheduler why a job waits and replies with what it
// says (nothing for a job it does not know).
func (s *Service) answerWhy(ctx context.Context, m *nats.Msg, whys chan<- whyQuery) {
	if !mesh.ReplyAllowed(m.Reply, "") {
		s.m.RepliesDropped.WithLabelValues("admission").Inc()
		s.log.Debug("why: reply subject refused", "len", len(m.Reply))
		return
	}
	q := whyQuery{id: strings.TrimPrefix(m.Subject, WhySubjectPrefix), reply: make(chan *Waiting, 1)}
	select {
	case whys <- q:
	case <-ctx.Done():
		return
	}
	if w := <-q.reply; w != nil {
		data, _ := json.Marshal(w)
		_ = m.Respond(data)
	}
}

// schedule is the scheduler's loop, the one goroutine that touches the
// models' queues: it admits what QUEUE delivers, dispatches at every slice
// and whenever a model's budget is expected to free, keeps held jobs alive
// and answers the signals, until ctx ends.
func (s *Service) schedule(ctx context.Context, in <-chan jetstream.Msg, sig signals) {
	batch := s.app().Admission.Batch
	msgs := make([]jetstream.Msg, 0, batch)
	tick := time.NewTicker(s.store.Params().Slice)
	defer tick.Stop()
	touch := time.NewTicker(KeepAliveEvery)
	defer touch.Stop()
	watch := time.NewTicker(min(KeepAliveEvery, s.holder.heldMax/4))
	defer watch.Stop()
	wake := time.NewTimer(time.Hour)
	defer wake.Stop()
	for {
		wake.Reset(s.holder.untilWake())
		select {
		case <-ctx.Done():
			s.returnLeases(context.WithoutCancel(ctx), true)
			s.holder.releaseAll()
			return
		case <-wake.C:
			s.dispatchAll(ctx)
		case <-tick.C:
			s.returnLeases(ctx, false)
			s.holder.expireHeld(ctx)
			s.dispatchAll(ctx)
			s.outage.checkStore(ctx)
		case <-watch.C:
			s.holder.watchHeld()
		case <-touch.C:
			s.holder.keepAlive()
			s.holder.countHeld()
		case q := <-sig.whys:
			q.reply <- s.holder.why(q.id)
		case key := <-sig.cancels:
			s.holder.dropCancelled(key)
		case m := <-in:
			msgs = takeBatch(append(msgs[:0], m), in, batch)
			s.admit(ctx, msgs)
		}
	}
}

// takeBatch adds to msgs what in holds now, up to batch messages.
func takeBatch(msgs []jetstream.Msg, in <-chan jetstream.Msg, batch int) []jetstream.Msg {
	for len(msgs) < batch {
		select {
		case m := <-in:
			msgs = append(msgs, m)
		default:
			return msgs
		}
	}
	return msgs
}
