package admission_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/streams"
)

// TestLateTenantSharesRPMBoundModel: through a running admission service,
// on a model whose requests bind (10 calls a second against 100 million
// tokens a minute), tenant a queues 40 small jobs and tenant b, arriving
// once a's calls have started, 40 more: b's first call follows what was
// placed before it arrived, and from then on b gets about half of the
// calls. (Charged in tokens, a's 40 jobs of 20 tokens fit its first
// quantum: b's first call came after all of a's.)
func TestLateTenantSharesRPMBoundModel(t *testing.T) {
	if testing.Short() {
		t.Skip("about 30 dispatches at 10 a second: the full tier runs it, not -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js := meshtest.JetStream(t, streams.Options{})
	cfg, err := config.Parse([]byte(`
providers:
  - {name: p, base_url: http://127.0.0.1:1/v1, models: [{name: m, rpm: 600, tpm: 100000000}]}
tenants: [{name: a}, {name: b}]
`))
	if err != nil {
		t.Fatal(err)
	}
	defer runAdmission(ctx, t, admission.Config{App: cfg}, meshtest.Open(t, js))()
	st, err := js.Stream(ctx, streams.Dispatch)
	if err != nil {
		t.Fatal(err)
	}
	queue := func(tenant string, from int) {
		var acks []jetstream.PubAckFuture
		for i := from; i < from+40; i++ {
			est := job.Estimate{PromptTokens: 10, MaxTokens: 10}
			data, _ := json.Marshal(task.Task{
				Job:         job.Job{ID: fmt.Sprintf("00000000-0000-7000-8000-%012d", i), Tenant: tenant, Priority: job.Standard, Provider: "p", Request: json.RawMessage(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)},
				Model:       "m",
				Estimate:    &est,
				SubmittedAt: time.Now(),
			})
			f, err := js.PublishAsync(job.QueueSubject(job.Standard, tenant), data)
			if err != nil {
				t.Fatal(err)
			}
			acks = append(acks, f)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatal(err)
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
	}
	var order strings.Builder
	var next uint64 = 1
	// tenants reads what DISPATCH holds past what was read, in order.
	tenants := func() string {
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for ; next <= info.State.LastSeq; next++ {
			raw, err := st.GetMsg(ctx, next)
			if err != nil {
				t.Fatal(err)
			}
			var j task.Task
			if err := json.Unmarshal(raw.Data, &j); err != nil {
				t.Fatal(err)
			}
			order.WriteString(j.Tenant)
		}
		return order.String()
	}
	queue("a", 0)
	natstest.Eventually(t, 30*time.Second, func() error {
		if got := tenants(); len(got) < 3 {
			return fmt.Errorf("dispatched %q, want a's calls started", got)
		}
		return nil
	})
	queue("b", 100)
	arrived := len(tenants())
	var since string
	k := -1
	natstest.Eventually(t, 30*time.Second, func() error {
		got := tenants()
		k = strings.IndexByte(got, 'b')
		if k < 0 || len(got)-k < 20 {
			return fmt.Errorf("dispatched %q, want 20 calls from b's first on", got)
		}
		since = got[k : k+20]
		return nil
	})
	// What was placed before b arrived goes first: at most
	// admission.BacklogHorizon ahead, 8 calls here.
	if k-arrived > 10 {
		t.Errorf("b's first call was the %dth after it arrived (%s), want within the 10 placed ahead", k-arrived+1, order.String())
	}
	if n := strings.Count(since, "b"); n < 8 || n > 12 {
		t.Errorf("from b's first call on, b got %d of 20 (%s; all: %s), want about half (8-12)", n, since, order.String())
	}
}
