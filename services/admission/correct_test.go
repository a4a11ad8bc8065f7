package admission_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/streams"
)

// TestBacklogPlacedWithCurrentCorrection: jobs queued before the fleet
// learned how the provider counts are reserved with the correction in force
// when each is placed: the prior before any answer, the learned one after,
// though their envelopes' estimates never changed.
func TestBacklogPlacedWithCurrentCorrection(t *testing.T) {
	if testing.Short() {
		t.Skip("one dispatch a second, about 8 s: the full tier runs it, not -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js, _ := queueServer(ctx, t, "{name: t}")
	cfg, err := config.Parse([]byte(`
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: m, rpm: 60, tpm: 100000000}]
tenants: [{name: t}]
`)) // one call a second: the backlog waits in admission
	if err != nil {
		t.Fatal(err)
	}
	m := meshtest.Open(t, js)
	defer runAdmission(ctx, t, admission.Config{App: cfg, Calib: calib.New(m.Budgets, nil)}, m)()
	const n, prompt, maxTokens = 6, 1000, 50
	for i := range n {
		est := job.Estimate{PromptTokens: prompt, MaxTokens: maxTokens, Class: "m_latin"}
		data, _ := json.Marshal(task.Task{
			Job:         job.Job{ID: fmt.Sprintf("00000000-0000-7000-8000-%012d", i), Tenant: "t", Priority: job.Standard, Provider: "p", Request: json.RawMessage(`{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`)},
			Model:       "m",
			Estimate:    &est,
			SubmittedAt: time.Now(),
		})
		if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, "t"), data); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, streams.Dispatch)
	if err != nil {
		t.Fatal(err)
	}
	reserved := func(seq uint64) int {
		var raw *jetstream.RawStreamMsg
		natstest.Eventually(t, 30*time.Second, func() (err error) {
			raw, err = st.GetMsg(ctx, seq) // dispatch seq not there yet
			return err
		})
		var j task.Task
		if err := json.Unmarshal(raw.Data, &j); err != nil || j.Reservation == nil {
			t.Fatalf("dispatch %d: %v", seq, err)
		}
		if j.Estimate.PromptTokens != prompt {
			t.Errorf("dispatch %d: the envelope's estimate became %d, want it left at %d", seq, j.Estimate.PromptTokens, prompt)
		}
		return j.Reservation.Tokens
	}
	if got, want := reserved(1), int(prompt*calib.Prior)+maxTokens; got != want {
		t.Errorf("first placement reserved %d tokens, want %d (the prior %.2f before any answer)", got, want, calib.Prior)
	}
	// Five answers reach an executor: the provider counts 40 % less.
	exec := calib.New(m.Budgets, nil)
	for range 5 {
		exec.Observe(ctx, "p", "m", "m_latin", prompt, prompt*6/10)
	}
	if got, want := reserved(n), prompt*6/10+maxTokens; got != want {
		t.Errorf("last placement reserved %d tokens, want %d (corrected to the provider's count)", got, want)
	}
}
