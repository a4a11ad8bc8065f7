package systest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestRateLimitRefusalsSpendNoAttempts configures Sluice with ten times the
// limits a provider really enforces, and hides them (no rate-limit headers,
// number-free 429 messages): Sluice misjudges and draws 429s. Every job
// allows one attempt only, so a 429 that cost an attempt would end its job
// dead-lettered. Each must instead go back to admission, spend nothing, and
// succeed with one attempt, while the fleet learns lower limits.
func TestRateLimitRefusalsSpendNoAttempts(t *testing.T) {
	SkipShort(t) // about a minute
	t.Parallel()
	const model = "gpt-4o-mini"
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 60, TPM: 1_000_000}},
		Profile: sim.ProfileHidden, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, model, 600, 10_000_000, `
retry:
  standard: {max_attempts: 1, max_elapsed: 3m, base_delay: 1s, max_delay: 10s}
`), Env)
	nc, cl := n.Connect(t)

	var mu sync.Mutex
	results := map[string]job.Result{}
	sub, err := nc.Subscribe(job.ResultPrefix+">", func(m *nats.Msg) {
		var r job.Result
		if json.Unmarshal(m.Data, &r) == nil {
			mu.Lock()
			results[r.JobID] = r
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const jobs = 40
	deadline := time.Now().Add(3 * time.Minute)
	for i := range jobs {
		if _, err := cl.Submit(ctx, &job.Job{Tenant: "acme", Priority: job.Standard, Deadline: &deadline, Request: ChatBody(model, 10+i, 20)}); err != nil {
			t.Fatal(err)
		}
	}
	if !natstest.Poll(ctx, func() bool { mu.Lock(); defer mu.Unlock(); return len(results) >= jobs }) {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d jobs finished", len(results), jobs)
	}
	mu.Lock()
	for id, r := range results {
		if r.Status != job.StatusSucceeded || r.Attempts != 1 {
			t.Errorf("job %s ended %s after %d attempts (%+v); a rate-limit refusal must cost no attempt", id, r.Status, r.Attempts, r.Error)
		}
	}
	mu.Unlock()
	ms := simSrv.Stats().Models[model]
	if ms.RateLimited == 0 {
		t.Fatalf("the provider refused nothing: the test did not make Sluice misjudge")
	}
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, "budgets")
	if err != nil {
		t.Fatal(err)
	}
	rec, _, err := adapt.NewStore(kv, nil).Get(ctx, adapt.Key("sim", job.ModelToken(model)))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Cuts == 0 {
		t.Errorf("%d refusals and no cut: the fleet learned nothing", ms.RateLimited)
	}
	t.Logf("provider: %d admitted, %d refused (%v); fleet record: %d cuts, last %q, per-second factors %v, learned per minute %v",
		ms.Admitted, ms.RateLimited, ms.RateLimitedBy, rec.Cuts, rec.LastReason, rec.Quantum, rec.Learned)
}
