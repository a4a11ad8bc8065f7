package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/guard"
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
		s.guard = guard.New(s.cfg.App, key)
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
	wg.Go(func() { s.affinity.run(bg) })
	wg.Go(func() { s.watchDeployments(bg) })
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

// consumeQueue pulls QUEUE into in, up to a batch ahead of the scheduler,
// and watches QUEUE's depth. stop drains the consumer and sends back what
// was pulled and not taken.
func (s *Service) consumeQueue(ctx context.Context) (in chan jetstream.Msg, stop func(), err error) {
	batch := s.cfg.App.Admission.Batch
	in = make(chan jetstream.Msg, batch)
	loop, err := s.mesh.Consume(ctx, mesh.Consumer{Stream: streams.Queue, Template: "admission", What: "queue", Batch: batch}, s.log, func(msg jetstream.Msg) {
		select {
		case in <- msg:
		case <-ctx.Done():
			// Shutting down: another admission process takes it now,
			// not after the ack wait.
			_ = msg.Nak()
		}
	})
	if err != nil {
		return nil, nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() { s.watchDepth(ctx) })
	stop = func() {
		// Messages pulled but not handed over yet go back at once (the
		// handler NAKs them once ctx is done), so a rolling restart does
		// not hold up to a batch of jobs for the 30 s ack wait.
		if !loop.Drain(2 * time.Second) {
			loop.Stop()
		}
		for {
			select {
			case m := <-in:
				_ = m.Nak()
				continue
			default:
			}
			break
		}
		wg.Wait()
	}
	return in, stop, nil
}

// signals are what other processes tell the scheduler: that a provider
// asked a model's fleet to wait, and "why does this job wait".
type signals struct {
	pauses chan pauseSignal
	whys   chan whyQuery
}

// listen subscribes to the signals and to the executors' transits
// (lead.go); unsubscribe ends the subscriptions.
func (s *Service) listen(ctx context.Context) (sig signals, unsubscribe func(), err error) {
	sig = signals{pauses: make(chan pauseSignal, 64), whys: make(chan whyQuery)}
	var subs []*nats.Subscription
	unsubscribe = func() {
		for i := len(subs) - 1; i >= 0; i-- {
			_ = subs[i].Unsubscribe()
		}
	}
	nc := s.mesh.JS.Conn()
	psub, err := nc.Subscribe(PauseSubjectPrefix+">", func(m *nats.Msg) {
		var p pauseSignal
		if json.Unmarshal(m.Data, &p) == nil {
			p.Key = budget.ModelKey(p.Provider, job.ModelToken(p.Model))
			select {
			case sig.pauses <- p:
			default:
			}
		}
	})
	if err != nil {
		return sig, nil, fmt.Errorf("subscribe pauses: %w", err)
	}
	subs = append(subs, psub)
	wsub, err := nc.Subscribe(WhySubjectPrefix+"*.*", func(m *nats.Msg) { s.answerWhy(ctx, m, sig.whys) })
	if err != nil {
		unsubscribe()
		return sig, nil, fmt.Errorf("subscribe why: %w", err)
	}
	subs = append(subs, wsub)
	tsub, err := s.watchTransits()
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
	batch := s.cfg.App.Admission.Batch
	msgs := make([]jetstream.Msg, 0, batch)
	tick := time.NewTicker(s.store.Params().Slice)
	defer tick.Stop()
	touch := time.NewTicker(KeepAliveEvery)
	defer touch.Stop()
	watch := time.NewTicker(min(KeepAliveEvery, s.heldMax/4))
	defer watch.Stop()
	wake := time.NewTimer(time.Hour)
	defer wake.Stop()
	for {
		wake.Reset(s.untilWake())
		select {
		case <-ctx.Done():
			s.returnLeases(context.WithoutCancel(ctx), true)
			s.releaseAll()
			return
		case <-wake.C:
			s.dispatchAll(ctx)
		case <-tick.C:
			s.returnLeases(ctx, false)
			s.expireHeld(ctx)
			s.dispatchAll(ctx)
			s.checkStore(ctx)
		case <-watch.C:
			s.watchHeld()
		case <-touch.C:
			s.keepAlive()
			s.countHeld()
		case p := <-sig.pauses:
			s.pauseModel(p)
		case q := <-sig.whys:
			q.reply <- s.why(q.id)
		case m := <-in:
			msgs = takeBatch(append(msgs[:0], m), in, batch)
			s.admit(ctx, msgs)
		}
	}
}

// untilWake is how long until the first model with jobs held expects its
// budget to free (its next placement comes within the horizon) before the
// next tick: a paced schedule stays continuous without waiting for ticks.
func (s *Service) untilWake() time.Duration {
	next := time.Time{}
	for _, q := range s.queues {
		if n, _ := q.sched.Len(); n > 0 && !q.wakeAt.IsZero() && (next.IsZero() || q.wakeAt.Before(next)) {
			next = q.wakeAt
		}
	}
	if next.IsZero() {
		return time.Hour
	}
	return max(time.Until(next), time.Millisecond)
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

// countHeld sets the held-jobs gauge per priority.
func (s *Service) countHeld() {
	for _, p := range job.Priorities {
		n := 0
		for _, q := range s.queues {
			n += q.sched.ClassLen(p)
		}
		s.m.Held.WithLabelValues(string(p)).Set(float64(n))
	}
}

// pauseModel holds a model: nothing is reserved for it until the signal's
// time. Each process resumes a little apart (jitter), and no signal holds
// a model longer than MaxPause, whoever sent it.
func (s *Service) pauseModel(p pauseSignal) {
	until := p.Until
	if limit := s.now().Add(MaxPause); until.After(limit) {
		until = limit
	}
	until = until.Add(jitter(PauseJitter))
	ms := s.models[p.Key]
	if ms != nil && until.After(ms.pausedUntil) {
		ms.pausedUntil, ms.reason = until, "paused_provider"
	}
}
