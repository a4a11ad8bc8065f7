package streams_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// The admission template's window is the configuration's default.
func TestAdmissionTemplateWindowIsTheDefault(t *testing.T) {
	t.Parallel()
	c, err := streams.Consumer(streams.Queue, "admission")
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxAckPending != config.DefaultTenantWindow {
		t.Errorf("QUEUE.admission.json: max_ack_pending %d, want admission.tenant_window's default %d", c.MaxAckPending, config.DefaultTenantWindow)
	}
}

// An older Sluice's admission consumer took all of QUEUE under one window.
// Ensure removes it, and every job it had been delivered and not
// acknowledged reaches its tenant's own consumer, under that tenant's
// window: none is lost in the move.
func TestEnsureRetiresFleetAdmission(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(natstest.Conn(t, natstest.Server(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	old, err := js.CreateConsumer(ctx, streams.Queue, jetstream.ConsumerConfig{Durable: streams.FleetAdmission,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 100_000})
	if err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"a", "b"} {
		for range 3 {
			if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, tenant), []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The old consumer holds four of them, unacknowledged.
	batch, err := old.Fetch(4, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for range batch.Messages() {
		held++
	}
	if held != 4 {
		t.Fatalf("the old consumer was delivered %d jobs, want 4", held)
	}

	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatalf("Ensure over the fleet-wide consumer: %v", err)
	}
	if _, err := js.Consumer(ctx, streams.Queue, streams.FleetAdmission); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("fleet-wide consumer after Ensure: got %v, want it removed", err)
	}
	for _, tenant := range []string{"a", "b"} {
		cons, err := streams.EnsureDurable(ctx, js, streams.Durable{Stream: streams.Queue, Template: "admission",
			Name: "admission-" + tenant, Filter: job.QueuePrefix + "*." + tenant, MaxAckPending: 2})
		if err != nil {
			t.Fatalf("tenant %s's consumer: %v", tenant, err)
		}
		if got := cons.CachedInfo().Config.MaxAckPending; got != 2 {
			t.Errorf("tenant %s's window: got %d, want 2", tenant, got)
		}
		// Three jobs through a window of two: each acknowledged frees room
		// for the next.
		for i := range 3 {
			b, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for m := range b.Messages() {
				n++
				if m.Subject() != job.QueueSubject(job.Standard, tenant) {
					t.Errorf("tenant %s's consumer got %s", tenant, m.Subject())
				}
				if err := m.DoubleAck(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if n != 1 {
				t.Fatalf("tenant %s: job %d of 3 not delivered (%v)", tenant, i+1, b.Error())
			}
		}
	}
	// What a template loaded by `nats consumer add` made takes no job: it stays.
	c, err := streams.Consumer(streams.Queue, "admission")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, streams.Queue, c); err != nil {
		t.Fatalf("the template as `nats consumer add` loads it, beside the tenants' consumers: %v", err)
	}
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Consumer(ctx, streams.Queue, streams.FleetAdmission); err != nil {
		t.Errorf("the template's consumer after Ensure: %v, want it kept", err)
	}
}
