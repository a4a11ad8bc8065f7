package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/streams"
)

// Consumer describes one service's consume loop on a stream.
type Consumer struct {
	// Stream, Template, Name, Filter and MaxAckPending are as for
	// streams.Durable.
	Stream, Template, Name, Filter string
	MaxAckPending                  int
	// What names the loop in errors and debug logs ("intake").
	What string
	// Batch is how many messages are pulled ahead; BatchBytes, when set,
	// bounds the bytes of one pull (at least the largest message, or the
	// loop stalls).
	Batch, BatchBytes int
	// Parallel is how many handlers run at once, each on a goroutine of
	// the loop's Workers; 0 runs the handler on the consume goroutine
	// itself (it must then hand work off and return).
	Parallel int
	// Middleware wraps the handler, the first outermost; Recover always
	// wraps them all.
	Middleware []Middleware
	// Restarted, when set, is called each time the loop is started again
	// after it ended by itself, with why (a RestartReason).
	Restarted func(why string)
}

// Why a consume loop ended by itself and was started again (Restarted;
// the sluice_consume_restarts_total metric's reason).
const (
	RestartNoResponders    = "no_responders"    // a pull no server answered: the consumer without a leader
	RestartConsumerDeleted = "consumer_deleted" // the server said the consumer is gone
	RestartBadRequest      = "bad_request"      // the server refused a pull
	RestartOther           = "other"            // ended with no error the loop recorded
)

// RestartReason names why err ended a consume loop.
func RestartReason(err error) string {
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return RestartNoResponders
	case errors.Is(err, jetstream.ErrConsumerDeleted):
		return RestartConsumerDeleted
	case errors.Is(err, jetstream.ErrBadRequest):
		return RestartBadRequest
	default:
		return RestartOther
	}
}

// Loop is a running consume loop. A loop the client ended by itself (the
// server answered that the consumer is gone, or refused a pull) or whose
// pull no server answered (the consumer without a leader) is started
// again, consumer included, until Stop or Drain: a process that stopped
// pulling would leave the messages it had been delivered unacknowledged
// and, with no pull waiting, never redelivered.
type Loop struct {
	m    *Mesh
	c    Consumer
	log  *slog.Logger
	h    func(jetstream.Msg)
	wg   sync.WaitGroup
	sem  chan struct{}
	mu   sync.Mutex
	cons jetstream.Consumer // the consumer ensured by the last start
	cc   jetstream.ConsumeContext
	err  error // the error that ended cc, if it ended by itself
	done bool  // Stop or Drain was called
	// Restarts counts loops started again.
	Restarts atomic.Int64
}

// restartFirst and restartWait bound the wait before starting again a
// loop that ended soon after it started; restartNoLeader bounds it when
// the loop ended because no server answered its pull, where asking again
// is one pull request and the leader's election, the event waited for,
// ends within seconds.
const restartFirst, restartWait, restartNoLeader = 100 * time.Millisecond, 5 * time.Second, time.Second

// Consume ensures the consumer and starts delivering its messages to
// handler, wrapped in c's middleware and Recover; what it returns is told
// JetStream (Settle). A missed heartbeat is routine (the server is briefly
// away) and is not logged; other consume errors are logged at debug level,
// as the client recovers from them itself, except those that end the loop
// (logged when it starts again).
func (m *Mesh) Consume(ctx context.Context, c Consumer, log *slog.Logger, handler Handler) (*Loop, error) {
	for i := len(c.Middleware) - 1; i >= 0; i-- {
		handler = c.Middleware[i](handler)
	}
	handler = Recover(log, c.What)(handler)
	h := func(msg jetstream.Msg) { Settle(msg, handler(ctx, msg), log, c.What, "") }
	l := &Loop{m: m, c: c, log: log, h: h}
	if c.Parallel > 0 {
		l.sem = make(chan struct{}, c.Parallel)
		workers := NewWorkers(ctx)
		l.h = func(msg jetstream.Msg) {
			l.sem <- struct{}{}
			l.wg.Add(1)
			workers.Go(func() {
				defer l.wg.Done()
				defer func() { <-l.sem }()
				h(msg)
			})
		}
	}
	cc, err := l.start(ctx)
	if err != nil {
		return nil, err
	}
	l.cc = cc
	go l.watch(ctx, cc)
	return l, nil
}

// start ensures the consumer (made again if it was deleted) and pulls
// from it.
func (l *Loop) start(ctx context.Context) (jetstream.ConsumeContext, error) {
	c := l.c
	cons, err := streams.EnsureDurable(ctx, l.m.JS, streams.Durable{Stream: c.Stream, Template: c.Template, Name: c.Name, Filter: c.Filter, MaxAckPending: c.MaxAckPending})
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.cons = cons
	l.mu.Unlock()
	return l.pull(cons)
}

// pull starts delivering cons's messages to the loop's handler.
func (l *Loop) pull(cons jetstream.Consumer) (jetstream.ConsumeContext, error) {
	c := l.c
	var pull jetstream.PullConsumeOpt = jetstream.PullMaxMessages(c.Batch)
	if c.BatchBytes > 0 {
		pull = jetstream.PullMaxMessagesWithBytesLimit(c.Batch, c.BatchBytes)
	}
	cc, err := cons.Consume(l.h, pull, streams.PullExpiry(), jetstream.ConsumeErrHandler(func(cc jetstream.ConsumeContext, err error) {
		switch {
		case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrBadRequest):
			l.ended(err)
		case errors.Is(err, nats.ErrNoResponders):
			// No server answered the pull: the consumer has no leader yet
			// (a cluster forming, a leader lost). The client would pull
			// again only after two missed heartbeats (5 s), idle all that
			// while; pull again instead (watch, with backoff).
			l.ended(err)
			cc.Drain()
		case !errors.Is(err, jetstream.ErrNoHeartbeat):
			l.log.Debug(c.What+" consume", "err", err)
		}
	}))
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", c.What, err)
	}
	return cc, nil
}

// ended records why the loop's consume context is ending by itself.
func (l *Loop) ended(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.err = err
}

// watch starts the loop again whenever it ends while it should run: at
// once if it had run for restartWait, else after a wait that doubles from
// 100 ms up to restartWait, so a consumer that stays unreachable is not
// asked again and again. A loop whose pull no server answered pulls again
// from the same consumer, waiting at most restartNoLeader: the consumer
// exists and is electing a leader, and ensuring it through the JetStream
// API, which needs that leader too, could only be slower.
func (l *Loop) watch(ctx context.Context, cc jetstream.ConsumeContext) {
	wait, began := restartFirst, time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-cc.Closed():
		}
		l.mu.Lock()
		done, why, cons := l.done, l.err, l.cons
		l.mu.Unlock()
		if done || l.m.JS.Conn().IsClosed() {
			return
		}
		reason := RestartReason(why)
		level, longest := slog.LevelWarn, restartWait
		if reason == RestartNoResponders {
			level, longest = slog.LevelDebug, restartNoLeader // routine while a cluster elects leaders
		}
		l.log.Log(ctx, level, l.c.What+" consume loop ended; starting it again", "consumer", l.c.Name, "err", why)
		if time.Since(began) >= restartWait {
			wait = restartFirst
		}
		for {
			if time.Since(began) < restartWait {
				select {
				case <-ctx.Done():
					return
				case <-time.After(min(wait, longest)):
				}
				wait = min(2*wait, restartWait)
			}
			began = time.Now()
			var err error
			if reason == RestartNoResponders && cons != nil {
				cc, err = l.pull(cons)
			} else {
				cc, err = l.start(ctx)
			}
			if err == nil {
				break
			}
			l.log.Debug(l.c.What+" consume restart", "err", err)
			reason = RestartOther // ensure it next time
		}
		l.mu.Lock()
		if l.done { // stopped while it restarted
			l.mu.Unlock()
			cc.Stop()
			return
		}
		l.cc, l.err = cc, nil
		l.mu.Unlock()
		l.Restarts.Add(1)
		if l.c.Restarted != nil {
			l.c.Restarted(RestartReason(why))
		}
	}
}

// current marks the loop done and returns its consume context.
func (l *Loop) current() jetstream.ConsumeContext {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
	return l.cc
}

// Stop stops delivering at once; messages pulled and not yet delivered go
// back after the ack wait.
func (l *Loop) Stop() { l.current().Stop() }

// Drain stops pulling, delivers what was already pulled and waits up to
// timeout for that, then for every handler still running. It reports
// whether the delivery ended within timeout.
func (l *Loop) Drain(timeout time.Duration) bool {
	cc := l.current()
	cc.Drain()
	closed := true
	select {
	case <-cc.Closed():
	case <-time.After(timeout):
		closed = false
	}
	l.wg.Wait()
	return closed
}
