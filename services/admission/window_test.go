package admission_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/streams"
)

// TestTenantWindow: tenant a's backlog on a 1-RPM model fills a's own
// QUEUE consumer's window and no more; the rest of it waits undelivered,
// and tenant b's job to an idle model is taken and dispatched meanwhile.
// (With one consumer for every tenant, a's held jobs took the whole window
// and b's job was never delivered.)
func TestTenantWindow(t *testing.T) {
	t.Parallel()
	const window, backlog = 5, 20
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{})
	js := m.JS
	cfg, err := config.Parse(fmt.Appendf(nil, `
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: slow, rpm: 1, tpm: 100000000, adaptive: false}, {name: fast, rpm: 100000, tpm: 100000000}]
tenants: [{name: a}, {name: b}]
admission: {tenant_window: %d}
`, window))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := admission.New(admission.Config{App: cfg}, m, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for i := range backlog {
		if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, "a"), jobOf(i, "a", "slow")); err != nil {
			t.Fatal(err)
		}
	}
	// a's window is full: one job dispatched (the model's minute), the
	// window's worth taken, the rest undelivered. (Run makes a's consumer
	// as it starts: it may not be there yet.)
	natstest.Eventually(t, 20*time.Second, func() error {
		cons, err := js.Consumer(ctx, streams.Queue, keys.AdmissionConsumer("a"))
		if err != nil {
			return err
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumAckPending != window || info.NumPending != backlog-window-1 {
			return fmt.Errorf("tenant a's consumer: %d taken, %d undelivered; want %d and %d", info.NumAckPending, info.NumPending, window, backlog-window-1)
		}
		if info.Config.MaxAckPending != window {
			return fmt.Errorf("tenant a's consumer: max_ack_pending %d, want %d", info.Config.MaxAckPending, window)
		}
		return nil
	})

	if _, err := js.Publish(ctx, job.QueueSubject(job.Interactive, "b"), jobOf(backlog, "b", "fast")); err != nil {
		t.Fatal(err)
	}
	dispatch, err := js.Stream(ctx, streams.Dispatch)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, func() error {
		if _, err := dispatch.GetLastMsgForSubject(ctx, job.DispatchSubject("p", "fast")); err != nil {
			return fmt.Errorf("tenant b's job to an idle model, behind a's backlog: not dispatched (%w)", err)
		}
		return nil
	})
}

// jobOf is a queued job i of tenant on model p/model.
func jobOf(i int, tenant, model string) []byte {
	est := job.Estimate{PromptTokens: 150, MaxTokens: 50}
	data, _ := json.Marshal(task.Task{
		Job:         job.Job{ID: fmt.Sprintf("00000000-0000-7000-8000-%012d", i), Tenant: tenant, Priority: job.Standard, Provider: "p", Request: json.RawMessage(`{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`)},
		Model:       model,
		Estimate:    &est,
		SubmittedAt: time.Now(),
	})
	return data
}
