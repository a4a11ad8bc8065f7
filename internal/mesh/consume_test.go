package mesh_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Every message reaches the handler, at most Parallel at once, and Drain
// returns only once the handlers have finished.
func TestConsumeLoop(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{})
	const n, parallel = 40, 3
	for i := range n {
		if _, err := m.JS.Publish(ctx, job.IntakeSubject("acme"), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	var running, most, handled atomic.Int64
	all := make(chan struct{})
	log := slog.New(slog.DiscardHandler)
	loop, err := m.Consume(ctx, mesh.Consumer{Stream: streams.Intake, Template: "ingest", What: "intake", Batch: 8, Parallel: parallel}, log, func(context.Context, jetstream.Msg) error {
		now := running.Add(1)
		for {
			old := most.Load()
			if now <= old || most.CompareAndSwap(old, now) {
				break
			}
		}
		// A hold, not a wait: handlers must overlap for the bound to be
		// tested, and nothing signals that the loop would start another.
		time.Sleep(time.Millisecond)
		running.Add(-1)
		if handled.Add(1) == n {
			close(all)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatalf("handled %d of %d messages", handled.Load(), n)
	}
	if !loop.Drain(10 * time.Second) {
		t.Error("Drain: delivery did not end in 10s")
	}
	if got := running.Load(); got != 0 {
		t.Errorf("after Drain: %d handlers still running, want 0", got)
	}
	if got := most.Load(); got > parallel || got < 1 {
		t.Errorf("handlers at once: got %d, want 1 to %d", got, parallel)
	}

	if _, err := m.Consume(ctx, mesh.Consumer{Stream: "NO_SUCH_STREAM", Template: "ingest", What: "none", Batch: 1}, log, func(context.Context, jetstream.Msg) error { return nil }); err == nil {
		t.Error("a consumer on an unknown stream: got no error")
	}
}

// A loop the client ends by itself (here: its consumer deleted, which the
// server answers pulls with "409 Consumer Deleted") starts again, consumer
// included, and delivers what is published after; Stop ends it for good.
func TestConsumeLoopRestarts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{})
	js := m.JS
	got := make(chan byte, 8)
	whys := make(chan string, 8)
	c := mesh.Consumer{Stream: streams.Intake, Template: "ingest", Name: "ingest-restart", What: "intake", Batch: 4,
		Restarted: func(why string) { whys <- why }}
	loop, err := m.Consume(ctx, c, slog.New(slog.DiscardHandler), func(_ context.Context, msg jetstream.Msg) error {
		got <- msg.Data()[0]
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Stop()
	publish := func(b byte) {
		t.Helper()
		if _, err := js.Publish(ctx, job.IntakeSubject("acme"), []byte{b}); err != nil {
			t.Fatal(err)
		}
	}
	// A consumer made again starts from the stream's first message, so
	// earlier ones may come again.
	receive := func(want byte) {
		t.Helper()
		for {
			select {
			case b := <-got:
				if b == want {
					return
				}
			case <-ctx.Done():
				t.Fatalf("message %d never delivered (loop restarts %d)", want, loop.Restarts.Load())
			}
		}
	}
	publish(1)
	receive(1)
	if err := js.DeleteConsumer(ctx, streams.Intake, c.Name); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 15*time.Second, func() error {
		if loop.Restarts.Load() == 0 {
			return errors.New("the loop has not restarted")
		}
		return nil
	})
	publish(2)
	receive(2)
	if _, err := js.Consumer(ctx, streams.Intake, c.Name); err != nil {
		t.Errorf("the consumer was not made again: %v", err)
	}
	if why := <-whys; why != mesh.RestartConsumerDeleted {
		t.Errorf("Restarted(%q), want %q", why, mesh.RestartConsumerDeleted)
	}
}

// A pull that no server answers ("503 No Responders": the consumer has no
// leader yet, as while a cluster forms) ends the loop, which starts again
// and delivers once the consumer answers, instead of the client waiting
// two missed heartbeats (5 s) before it pulls again. Here the loop's
// JetStream API goes through a relay that answers everything but pulls
// until the loop has restarted once.
func TestConsumeLoopRestartsWhenNoServerAnswers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{})
	nc := m.JS.Conn()
	const prefix = "RELAYED.API"
	relay := func(msg *nats.Msg) {
		out := nats.NewMsg("$JS.API" + strings.TrimPrefix(msg.Subject, prefix))
		out.Reply, out.Header, out.Data = msg.Reply, msg.Header, msg.Data
		if err := nc.PublishMsg(out); err != nil {
			t.Error(err)
		}
	}
	for _, subj := range []string{prefix + ".*", prefix + ".STREAM.>", prefix + ".CONSUMER.DURABLE.>", prefix + ".CONSUMER.INFO.>"} {
		if _, err := nc.Subscribe(subj, relay); err != nil {
			t.Fatal(err)
		}
	}
	var creates atomic.Int64
	if _, err := nc.Subscribe(prefix+".CONSUMER.CREATE.>", func(msg *nats.Msg) {
		creates.Add(1)
		relay(msg)
	}); err != nil {
		t.Fatal(err)
	}
	relayed, err := jetstream.NewWithAPIPrefix(nc, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.JS.Publish(ctx, job.IntakeSubject("acme"), []byte{7}); err != nil {
		t.Fatal(err)
	}
	got := make(chan byte, 8)
	whys := make(chan string, 64)
	c := mesh.Consumer{Stream: streams.Intake, Template: "ingest", Name: "ingest-unanswered", What: "intake", Batch: 4,
		Restarted: func(why string) { whys <- why }}
	loop, err := (&mesh.Mesh{JS: relayed}).Consume(ctx, c, slog.New(slog.DiscardHandler), func(_ context.Context, msg jetstream.Msg) error {
		got <- msg.Data()[0]
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Stop()
	natstest.Eventually(t, 20*time.Second, func() error {
		if loop.Restarts.Load() == 0 {
			return errors.New("the loop whose pull no server answered has not started again")
		}
		return nil
	})
	if _, err := nc.Subscribe(prefix+".CONSUMER.MSG.NEXT.>", relay); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if b != 7 {
			t.Errorf("delivered %d, want 7", b)
		}
	case <-ctx.Done():
		t.Fatalf("never delivered once pulls were answered (loop restarts %d)", loop.Restarts.Load())
	}
	if why := <-whys; why != mesh.RestartNoResponders {
		t.Errorf("Restarted(%q), want %q", why, mesh.RestartNoResponders)
	}
	// The consumer exists, only its pulls went unanswered: the loop pulled
	// again from it rather than asking the JetStream API to make it again.
	if n := creates.Load(); n != 1 {
		t.Errorf("the consumer was created %d times, want once", n)
	}
}
