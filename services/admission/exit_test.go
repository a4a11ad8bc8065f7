package admission_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/streams"
)

// The jobs admission ends (one that does not validate, one past its
// deadline) end with results as complete as the executor's: submission,
// attempts, and the deployment the job named.
func TestEndedJobsResultsComplete(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js := meshtest.JetStream(t, streams.Options{})
	cfg, err := config.Parse([]byte(`
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: m, rpm: 60, tpm: 100000000, adaptive: false}]
tenants: [{name: t}]
`))
	if err != nil {
		t.Fatal(err)
	}
	m := meshtest.Open(t, js)
	key, err := guard.LoadKey(ctx, m.Fleet)
	if err != nil {
		t.Fatal(err)
	}
	defer runAdmission(ctx, t, admission.Config{App: cfg, Guard: guard.New(cfg, key)}, m)()
	sub := time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond)
	past := time.Now().Add(-time.Second)
	tried := []job.Attempt{{N: 1, Provider: "p", Model: "m", StartedAt: sub}}
	for _, tc := range []struct {
		name, model string
		deadline    *time.Time
		want        job.Status
	}{
		{"invalid", "not-configured", nil, job.StatusFailed},
		{"expired", "m", &past, job.StatusExpired},
	} {
		id := job.NewID()
		est := job.Estimate{PromptTokens: 150, MaxTokens: 50}
		data, _ := json.Marshal(task.Task{
			Job: job.Job{ID: id, Tenant: "t", Priority: job.Standard, Provider: "p", Deadline: tc.deadline,
				Request: json.RawMessage(`{"model":"` + tc.model + `","messages":[{"role":"user","content":"hi"}]}`)},
			Model: tc.model, Estimate: &est, SubmittedAt: sub, Attempts: tried,
		})
		if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, "t"), data); err != nil {
			t.Fatal(err)
		}
		var r job.Result
		natstest.Eventually(t, 30*time.Second, func() error {
			st, err := js.Stream(ctx, streams.Results)
			if err != nil {
				return err
			}
			msg, err := st.GetLastMsgForSubject(ctx, job.StoreSubject("t", id))
			if err != nil {
				return fmt.Errorf("%s: no result yet: %w", tc.name, err)
			}
			return json.Unmarshal(msg.Data, &r)
		})
		if r.Status != tc.want || r.Attempts != 1 || r.Provider != "p" || r.Model != tc.model || !r.SubmittedAt.Equal(sub) || r.CompletedAt.IsZero() {
			t.Errorf("%s: result %+v; want %s after 1 attempt on p/%s, submitted %v, completed", tc.name, r, tc.want, tc.model, sub)
		}
	}
}
