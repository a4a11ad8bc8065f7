package mesh_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want mesh.Decision
	}{
		{nil, mesh.Decision{Op: mesh.OpAck}},
		{mesh.ErrKept, mesh.Decision{Op: mesh.OpKeep}},
		{mesh.Poison(errors.New("bad")), mesh.Decision{Op: mesh.OpTerm}},
		{&mesh.PoisonError{Code: "x", Err: errors.New("bad")}, mesh.Decision{Op: mesh.OpTerm}},
		{mesh.Retry(90 * time.Second), mesh.Decision{Op: mesh.OpNak, Delay: 90 * time.Second}},
		{fmt.Errorf("lost call: %w", mesh.Retry(5*time.Second)), mesh.Decision{Op: mesh.OpNak, Delay: 5 * time.Second}},
		{mesh.Retry(0), mesh.Decision{Op: mesh.OpNak}},
		{errors.New("kv unavailable"), mesh.Decision{Op: mesh.OpNak, Delay: mesh.ErrorDelay}},
		{mesh.ErrPanicked, mesh.Decision{Op: mesh.OpNak, Delay: mesh.ErrorDelay}},
	} {
		if got := mesh.Decide(tc.err); got != tc.want {
			t.Errorf("Decide(%v) = %+v, want %+v", tc.err, got, tc.want)
		}
	}
}

// loopSetup is a mesh and a consume loop on INTAKE, as ingest's, with h.
func loopSetup(t *testing.T, ctx context.Context, name string, mw []mesh.Middleware, h mesh.Handler) (*mesh.Mesh, jetstream.Consumer) {
	t.Helper()
	m := meshtest.New(t, streams.Options{})
	c := mesh.Consumer{Stream: streams.Intake, Template: "ingest", Name: name, What: "intake", Batch: 4, Middleware: mw}
	loop, err := m.Consume(ctx, c, slog.New(slog.DiscardHandler), h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(loop.Stop)
	cons, err := m.JS.Consumer(ctx, streams.Intake, name)
	if err != nil {
		t.Fatal(err)
	}
	return m, cons
}

// A handler that panics does not stop the loop, and its message is not
// lost: it comes again and is handled.
func TestRecoverKeepsTheMessage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var deliveries atomic.Int64
	handled := make(chan byte, 4)
	m, _ := loopSetup(t, ctx, "ingest-recover", nil, func(_ context.Context, msg jetstream.Msg) error {
		if msg.Data()[0] == 1 && deliveries.Add(1) == 1 {
			panic("a bug")
		}
		handled <- msg.Data()[0]
		return nil
	})
	for _, b := range []byte{1, 2} {
		if _, err := m.JS.Publish(ctx, job.IntakeSubject("acme"), []byte{b}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[byte]bool{}
	for len(got) < 2 {
		select {
		case b := <-handled:
			got[b] = true
		case <-ctx.Done():
			t.Fatalf("handled %v; want both messages, the one that panicked again", got)
		}
	}
	if n := deliveries.Load(); n != 2 {
		t.Errorf("the message that panicked was delivered %d times, want 2", n)
	}
}

// A poison message is dropped by the rule once: logged, counted,
// terminated (never delivered again); the loop goes on.
func TestPoisonTermedOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	counted := map[string]int{}
	rule := mesh.PoisonRule{Log: slog.New(slog.DiscardHandler), Stage: "intake", Count: func(stage, code string) {
		mu.Lock()
		counted[stage+"/"+code]++
		mu.Unlock()
	}}
	var calls atomic.Int64
	good := make(chan string, 1)
	m, cons := loopSetup(t, ctx, "ingest-poison", []mesh.Middleware{rule.Middleware}, func(_ context.Context, msg jetstream.Msg) error {
		calls.Add(1)
		j, err := mesh.DecodeTask(msg)
		if err != nil {
			return err
		}
		good <- j.ID
		return nil
	})
	valid, _ := json.Marshal(&task.Task{Job: job.Job{ID: job.NewID(), Tenant: "acme"}})
	for _, data := range [][]byte{[]byte("{not json"), []byte(`{"tenant":"acme"}`), valid} {
		if _, err := m.JS.Publish(ctx, job.IntakeSubject("acme"), data); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-good:
	case <-ctx.Done():
		t.Fatal("the valid message after the poison ones was never handled")
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.AckFloor.Stream != 3 || info.NumAckPending != 0 || info.NumRedelivered != 0 {
			return fmt.Errorf("ack floor %d, %d pending, %d redelivered; want all 3 settled, none again", info.AckFloor.Stream, info.NumAckPending, info.NumRedelivered)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if n := counted["intake/undecodable"]; n != 2 || len(counted) != 1 {
		t.Errorf("counted %v; want intake/undecodable twice (once per poison message)", counted)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("handler called %d times, want 3 (once per message)", n)
	}
}
