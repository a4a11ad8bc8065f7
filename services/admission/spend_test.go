package admission_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/streams"
)

// TestSpendHolds: admission holds each job's worst case in its tenant's
// spend budget before dispatching it (here 1,024 default output tokens at
// 1 per million: 0.001024 each, two fit in 0.0025), refuses one that does
// not fit (on_exceed: refuse) and one for a model without a price, and
// lets a job that holds enough already (back for another attempt) pass
// without holding again.
func TestSpendHolds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := meshtest.JetStream(t, streams.Options{})
	cfg, err := config.Parse([]byte(`
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models:
      - {name: m, rpm: 100000, tpm: 100000000, price: {input_per_mtok: 0, output_per_mtok: 1}}
      - {name: u, rpm: 100000, tpm: 100000000}
tenants: [{name: t, spend: {per_day: 0.0025, on_exceed: refuse}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	m := meshtest.Open(t, js)
	svc, err := admission.New(admission.Config{App: cfg}, m, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	defer func() { stop(); <-done }()

	const worst = int64(1_024_000) // billionths
	publish := func(i int, model string, hold *task.SpendHold) string {
		j := task.Task{
			Job:         job.Job{ID: fmt.Sprintf("00000000-0000-7000-8000-%012d", i), Tenant: "t", Priority: job.Standard, Provider: "p", Request: json.RawMessage(`{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`)},
			Model:       model,
			SubmittedAt: time.Now(),
			SpendHold:   hold,
		}
		data, _ := json.Marshal(j)
		if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, "t"), data); err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	ids := []string{publish(1, "m", nil), publish(2, "m", nil), publish(3, "m", nil)}
	dispatched := awaitDispatched(ctx, t, js, 2)
	for _, j := range dispatched {
		if j.SpendHold == nil || j.SpendHold.Amount != worst || j.SpendHold.Day != time.Now().UTC().Format("20060102") {
			t.Errorf("dispatched %s holds %+v, want %d today", j.ID, j.SpendHold, worst)
		}
	}
	refused := ""
	for _, id := range ids {
		if id != dispatched[0].ID && id != dispatched[1].ID {
			refused = id
		}
	}
	if r := awaitResult(ctx, t, js, refused); r.Error == nil || r.Error.Code != job.CodeSpendBudget || !strings.Contains(r.Error.Message, "per_day") {
		t.Errorf("third job: %+v, want %s naming per_day", r.Error, job.CodeSpendBudget)
	}
	if r := awaitResult(ctx, t, js, publish(4, "u", nil)); r.Error == nil || r.Error.Code != job.CodeSpendBudget || !strings.Contains(r.Error.Message, "no price") {
		t.Errorf("unpriced model: %+v, want %s saying it has no price", r.Error, job.CodeSpendBudget)
	}
	// Back for another attempt, holding its worst case: it passes free.
	publish(5, "m", &task.SpendHold{Amount: worst, Day: time.Now().UTC().Format("20060102")})
	awaitDispatched(ctx, t, js, 3)
	if _, held, _ := budget.NewSpendLedger(m.Budgets, nil).Spent(ctx, "t", time.Now().UTC().Format("20060102")); held != 2*worst {
		t.Errorf("the window holds %d, want the first two jobs' %d", held, 2*worst)
	}
}

// awaitDispatched waits for n jobs in DISPATCH and returns them.
func awaitDispatched(ctx context.Context, t *testing.T, js jetstream.JetStream, n int) []task.Task {
	t.Helper()
	st, err := js.Stream(ctx, streams.Dispatch)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, func() error {
		if info, err := st.Info(ctx); err != nil || info.State.Msgs < uint64(n) {
			return errors.New("not dispatched yet")
		}
		return nil
	})
	var out []task.Task
	for seq := uint64(1); len(out) < n; seq++ {
		raw, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var j task.Task
		if err := json.Unmarshal(raw.Data, &j); err != nil {
			t.Fatal(err)
		}
		out = append(out, j)
	}
	return out
}

// awaitResult waits for tenant t's job id's result in RESULTS.
func awaitResult(ctx context.Context, t *testing.T, js jetstream.JetStream, id string) *job.Result {
	t.Helper()
	st, err := js.Stream(ctx, streams.Results)
	if err != nil {
		t.Fatal(err)
	}
	var r job.Result
	natstest.Eventually(t, 20*time.Second, func() error {
		raw, err := st.GetLastMsgForSubject(ctx, job.StoreSubject("t", id))
		if err != nil {
			return err
		}
		return json.Unmarshal(raw.Data, &r)
	})
	return &r
}
