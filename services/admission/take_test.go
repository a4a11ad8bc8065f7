package admission

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// take makes a tenant's consumer once, however often it is called, and
// takes a tenant that was not there at start (a configuration reload):
// its jobs reach the scheduler's channel. stop sends back what was pulled.
func TestTakeTenantAgainAndLater(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{})
	cfg, err := config.Parse([]byte("tenants: [{name: a}]\nadmission: {tenant_window: 7}\n"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{App: cfg}, m, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	q := &queueTakers{s: s, ctx: ctx, in: make(chan jetstream.Msg, 4), quit: make(chan struct{}), loops: map[string]*mesh.Loop{}}
	defer q.stop()
	if err := q.takeAll(cfg.Tenants); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"a", "a", "b"} {
		if err := q.take(tenant); err != nil {
			t.Fatalf("take(%s): %v", tenant, err)
		}
	}
	if err := q.take("a.>"); err == nil {
		t.Error("take(a.>): got nil, want an error: not a tenant name")
	}
	q.mu.Lock()
	n := len(q.loops)
	q.mu.Unlock()
	if n != 2 {
		t.Errorf("%d consume loops, want one per tenant, 2", n)
	}
	for _, tenant := range []string{"a", "b"} {
		cons, err := m.JS.Consumer(ctx, streams.Queue, keys.AdmissionConsumer(tenant))
		if err != nil {
			t.Fatalf("tenant %s's consumer: %v", tenant, err)
		}
		c := cons.CachedInfo().Config
		if c.MaxAckPending != 7 || c.FilterSubject != job.QueuePrefix+"*."+tenant {
			t.Errorf("tenant %s's consumer: window %d filter %q, want 7 and %q", tenant, c.MaxAckPending, c.FilterSubject, job.QueuePrefix+"*."+tenant)
		}
		if _, err := m.JS.Publish(ctx, job.QueueSubject(job.Batch, tenant), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		select {
		case msg := <-q.in:
			if msg.Subject() != job.QueueSubject(job.Batch, tenant) {
				t.Errorf("tenant %s: got %s", tenant, msg.Subject())
			}
		case <-ctx.Done():
			t.Fatalf("tenant %s's job never reached the scheduler", tenant)
		}
	}
}
