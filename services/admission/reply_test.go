package admission_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
)

// TestWhyAnswersOnlyReplies: admission answers "why does this job wait"
// on a reply inbox, and drops (and counts) a request whose reply subject
// is aimed elsewhere, here another tenant's result subject.
func TestWhyAnswersOnlyReplies(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js, cfg := queueServer(ctx, t, "{name: t}")
	m := meshtest.Open(t, js)
	key, err := guard.LoadKey(ctx, m.Fleet)
	if err != nil {
		t.Fatal(err)
	}
	// A budget store that is gone holds the job in admission.
	if m.Budgets, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "gone"}); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	ms := metrics.New(prometheus.NewRegistry())
	svc, err := admission.New(admission.Config{App: cfg, Guard: guard.New(cfg, key), LetGoAfter: time.Minute}, m, slog.New(slog.DiscardHandler), ms)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()
	if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, "t"), queued(1)); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("00000000-0000-7000-8000-%012d", 1)
	natstest.Eventually(t, 30*time.Second, func() error {
		_, err := nc.Request(mesh.WhySubject("t", id), nil, time.Second) // admission does not hold the job yet
		return err
	})
	watch, err := nc.SubscribeSync(job.ResultPrefix + "other.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(mesh.WhySubject("t", id), job.ResultSubject("other", id), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Request(mesh.WhySubject("t", id), nil, 5*time.Second); err != nil {
		t.Errorf("why, asked on an inbox: %v", err)
	}
	if msg, err := watch.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("an answer reached %s: %q", msg.Subject, msg.Data)
	}
	var dropped dto.Metric
	if err := ms.RepliesDropped.WithLabelValues("admission").Write(&dropped); err != nil {
		t.Fatal(err)
	}
	if got := dropped.GetCounter().GetValue(); got != 1 {
		t.Errorf("replies dropped = %v, want 1", got)
	}
}
