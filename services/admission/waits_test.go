package admission_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/streams"
)

// TestWaitsAnsweredAndCancelledDropped: a job a tenant's day budget sends
// back to QUEUE says so, with the day's end as its expected end; a job held
// for the model's pace says rpm, and once its cancellation is announced
// admission drops it from QUEUE rather than dispatching it.
func TestWaitsAnsweredAndCancelledDropped(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js := meshtest.JetStream(t, streams.Options{})
	nc := js.Conn()
	cfg, err := config.Parse([]byte(`
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: m, rpm: 1, tpm: 100000000, adaptive: false}]
tenants: [{name: t, rpd: 1}, {name: u}]
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
	publish := func(tenant string, i int) string {
		id := fmt.Sprintf("00000000-0000-7000-8000-%012d", i)
		est := job.Estimate{PromptTokens: 150, MaxTokens: 50}
		data, _ := json.Marshal(task.Task{
			Job:         job.Job{ID: id, Tenant: tenant, Priority: job.Standard, Provider: "p", Request: json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)},
			Model:       "m",
			Estimate:    &est,
			SubmittedAt: time.Now(),
		})
		if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, tenant), data); err != nil {
			t.Fatal(err)
		}
		return id
	}
	why := func(tenant, id string) (*mesh.Waiting, error) {
		msg, err := nc.Request(mesh.WhySubject(tenant, id), nil, time.Second)
		if err != nil {
			return nil, err
		}
		var w mesh.Waiting
		return &w, json.Unmarshal(msg.Data, &w)
	}
	publish("t", 1)
	second := publish("t", 2)
	natstest.Eventually(t, 30*time.Second, func() error {
		w, err := why("t", second)
		if err != nil || w.Reason != "tenant_rpd" || time.Until(w.Until) < time.Hour {
			return fmt.Errorf("t's second job: got %+v (%v), want tenant_rpd until about a day ahead", w, err)
		}
		return nil
	})
	// u's job waits for the model's rpm (one a minute, spent by t's first).
	held := publish("u", 3)
	natstest.Eventually(t, 30*time.Second, func() error {
		w, err := why("u", held)
		if err != nil || w.Reason != "rpm" || w.Position != 1 || !w.Until.After(time.Now()) {
			return fmt.Errorf("u's job: got %+v (%v), want rpm, position 1, an end ahead", w, err)
		}
		return nil
	})
	if err := nc.Publish(mesh.CancelledSubject("u", held), nil); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(job.QueueSubject(job.Standard, "u")))
		if err != nil {
			return err
		}
		if n := info.State.Subjects[job.QueueSubject(job.Standard, "u")]; n != 0 {
			return fmt.Errorf("u's cancelled job still in QUEUE (%d)", n)
		}
		return nil
	})
	if _, err := why("u", held); err == nil {
		t.Error("admission still answers for the cancelled job")
	}
}
