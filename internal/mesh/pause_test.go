package mesh_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// PauseDispatch pauses the deployment's DISPATCH consumer until the time
// given.
func TestPauseDispatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{})
	name := keys.DispatchConsumer("p", job.ModelToken("m"))
	loop, err := m.Consume(ctx, mesh.Consumer{Stream: streams.Dispatch, Template: "executor", Name: name, Filter: job.DispatchSubject("p", "m"), What: name, Batch: 1},
		slog.New(slog.DiscardHandler), func(context.Context, jetstream.Msg) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Stop()
	until := time.Now().Add(time.Minute).UTC().Truncate(time.Millisecond)
	if err := m.PauseDispatch(ctx, "p", "m", until); err != nil {
		t.Fatal(err)
	}
	c, err := m.JS.Consumer(ctx, streams.Dispatch, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Paused || info.Config.PauseUntil == nil || !info.Config.PauseUntil.Equal(until) {
		t.Errorf("consumer paused %v until %v, want paused until %v", info.Paused, info.Config.PauseUntil, until)
	}
}
