package mesh

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	js, err := jetstream.New(natstest.Conn(t, natstest.Server(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	m, err := Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	const n, parallel = 40, 3
	for i := range n {
		if _, err := js.Publish(ctx, job.IntakeSubject("acme"), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	var running, most, handled atomic.Int64
	all := make(chan struct{})
	log := slog.New(slog.DiscardHandler)
	loop, err := m.Consume(ctx, Consumer{Stream: streams.Intake, Template: "ingest", What: "intake", Batch: 8, Parallel: parallel}, log, func(msg jetstream.Msg) {
		now := running.Add(1)
		for {
			old := most.Load()
			if now <= old || most.CompareAndSwap(old, now) {
				break
			}
		}
		time.Sleep(time.Millisecond) // let the handlers overlap
		_ = msg.Ack()
		running.Add(-1)
		if handled.Add(1) == n {
			close(all)
		}
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

	if _, err := m.Consume(ctx, Consumer{Stream: "NO_SUCH_STREAM", Template: "ingest", What: "none", Batch: 1}, log, func(jetstream.Msg) {}); err == nil {
		t.Error("a consumer on an unknown stream: got no error")
	}
}
