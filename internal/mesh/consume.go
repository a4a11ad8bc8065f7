package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/streams"
)

// Consumer describes one service's consume loop on a stream.
type Consumer struct {
	// Stream, Template, Name and Filter are as for streams.EnsureConsumer.
	Stream, Template, Name, Filter string
	// What names the loop in errors and debug logs ("intake").
	What string
	// Batch is how many messages are pulled ahead.
	Batch int
	// Parallel is how many handlers run at once, each on its own
	// goroutine; 0 runs the handler on the consume goroutine itself (it
	// must then hand work off and return).
	Parallel int
}

// Loop is a running consume loop.
type Loop struct {
	cc  jetstream.ConsumeContext
	wg  sync.WaitGroup
	sem chan struct{}
}

// Consume ensures the consumer and starts delivering its messages to h.
// A missed heartbeat is routine (the server is briefly away) and is not
// logged; other consume errors are logged at debug level, as the client
// recovers from them itself.
func (m *Mesh) Consume(ctx context.Context, c Consumer, log *slog.Logger, h func(jetstream.Msg)) (*Loop, error) {
	cons, err := streams.EnsureConsumer(ctx, m.JS, c.Stream, c.Template, c.Name, c.Filter)
	if err != nil {
		return nil, err
	}
	l := &Loop{}
	deliver := h
	if c.Parallel > 0 {
		l.sem = make(chan struct{}, c.Parallel)
		deliver = func(msg jetstream.Msg) {
			l.sem <- struct{}{}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				defer func() { <-l.sem }()
				h(msg)
			}()
		}
	}
	l.cc, err = cons.Consume(deliver, jetstream.PullMaxMessages(c.Batch), streams.PullExpiry(), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if !errors.Is(err, jetstream.ErrNoHeartbeat) {
			log.Debug(c.What+" consume", "err", err)
		}
	}))
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", c.What, err)
	}
	return l, nil
}

// Stop stops delivering at once; messages pulled and not yet delivered go
// back after the ack wait.
func (l *Loop) Stop() { l.cc.Stop() }

// Drain stops pulling, delivers what was already pulled and waits up to
// timeout for that, then for every handler still running. It reports
// whether the delivery ended within timeout.
func (l *Loop) Drain(timeout time.Duration) bool {
	l.cc.Drain()
	closed := true
	select {
	case <-l.cc.Closed():
	case <-time.After(timeout):
		closed = false
	}
	l.wg.Wait()
	return closed
}
