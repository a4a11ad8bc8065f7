package systest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/services/executor"
)

// TestQuotaErrorIsNeverRetried: insufficient_quota reaches the caller with
// its code after exactly one provider call, and the job is dead-lettered.
func TestQuotaErrorIsNeverRetried(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 1000, TPM: 1000000}},
		APIKeys: []string{"sim-secret"}, Faults: sim.Faults{QuotaModels: []string{"gpt-4o-mini"}}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 1000, 1000000, ""), Env)
	nc, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cl.Do(ctx, &job.Job{Tenant: "acme", Priority: job.Batch, Request: ChatBody("gpt-4o-mini", 5, 16)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != job.StatusFailed || res.Error == nil || res.Error.Code != "insufficient_quota" || res.Attempts != 1 {
		t.Fatalf("got %+v (error %+v), want failed insufficient_quota after 1 attempt", res, res.Error)
	}
	if got := simSrv.Stats().Requests[429]; got != 1 {
		t.Errorf("provider saw %d quota answers, want exactly 1 (never retried)", got)
	}
	js, _ := jetstream.New(nc)
	e, err := dlq.Get(ctx, js, "", res.JobID)
	if err != nil || e.Reason != "operator_action" || e.LastError == nil || e.LastError.Code != "insufficient_quota" {
		t.Errorf("dead letter %+v (%v), want reason operator_action with the quota error", e, err)
	}
}

// TestExpiredJobNeverReachesProvider: a job whose deadline passes while it
// waits for budget ends expired, and the provider never sees it.
func TestExpiredJobNeverReachesProvider(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 1, TPM: 1000000}}, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 1, 1000000, ""), Env)
	_, cl := n.Connect(t)
	// Room for one lapsed instant: an executor late for the first job's
	// instant (a loaded CI machine) sends nothing, and its next plan is a
	// minute later (pacing is not rewound).
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	// The first job takes the minute's only request.
	if res, err := cl.Do(ctx, &job.Job{Tenant: "acme", Request: ChatBody("gpt-4o-mini", 5, 16)}); err != nil || res.Status != job.StatusSucceeded {
		t.Fatalf("first job: %+v %v", res, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	res, err := cl.Do(ctx, &job.Job{Tenant: "acme", Deadline: &deadline, Request: ChatBody("gpt-4o-mini", 5, 16)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != job.StatusExpired || res.Attempts != 0 {
		t.Errorf("got %s after %d attempts, want expired with none", res.Status, res.Attempts)
	}
	if got := simSrv.Stats().Models["gpt-4o-mini"].Admitted + simSrv.Stats().Models["gpt-4o-mini"].RateLimited; got != 1 {
		t.Errorf("provider saw %d requests, want 1 (the expired job never reached it)", got)
	}
	if time.Since(deadline) > 5*time.Second {
		t.Errorf("the expired result came %s after the deadline", time.Since(deadline))
	}
}

// TestFallbacks routes around a failing primary on the named conditions and
// never on a 400.
func TestFallbacks(t *testing.T) {
	t.Parallel()
	primary, primaryURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini"}, {Name: "gpt-4o"}},
		APIKeys: []string{"sim-secret"}, Faults: sim.Faults{Rate500: 1}})
	broken, brokenURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4.1"}}, APIKeys: []string{"another-key"}})
	backup, backupURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "backup-model"}}})
	var strictCalls atomic.Int64
	strict := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		strictCalls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`))
	}))
	t.Cleanup(strict.Close)
	cfg := fmt.Sprintf(`
providers:
  - name: primary
    base_url: %s/v1
    api_key_env: SIM_KEY
    models: [{name: gpt-4o-mini}, {name: gpt-4o}]
  - name: broken
    base_url: %s/v1
    api_key_env: SIM_KEY
    models: [{name: gpt-4.1}]
  - name: backup
    base_url: %s/v1
    models: [{name: backup-model}]
  - name: strict
    base_url: %s/v1
    models: [{name: strict-model}]
tenants:
  - {name: acme, api_key_env: ACME_KEY}
retry:
  standard: {max_attempts: 2, max_elapsed: 10s, base_delay: 10ms, max_delay: 50ms}
routes:
  - primary: {provider: primary, model: gpt-4o-mini}
    fallbacks: [{provider: backup, model: backup-model, when: [provider_5xx]}]
  - primary: {provider: broken, model: gpt-4.1}
    fallbacks: [{provider: backup, model: backup-model, when: [primary_unavailable]}]
  - primary: {provider: strict, model: strict-model}
    fallbacks: [{provider: backup, model: backup-model}]
`, primaryURL, brokenURL, backupURL, strict.URL)
	n := Start(t, cfg, Env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, tc := range []struct {
		name, model string
	}{{"provider_5xx", "gpt-4o-mini"}, {"primary_unavailable (401)", "gpt-4.1"}} {
		res, err := cl.Do(ctx, &job.Job{Tenant: "acme", Request: ChatBody(tc.model, 5, 16)})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if res.Status != job.StatusSucceeded || res.Provider != "backup" || res.Model != "backup-model" {
			t.Errorf("%s: got %s on %s/%s (%+v), want success on the backup", tc.name, res.Status, res.Provider, res.Model, res.Error)
		}
	}
	if got := backup.Stats().Completed; got != 2 {
		t.Errorf("backup completed %d calls, want 2", got)
	}
	if got := broken.Stats().Requests[401]; got != 1 {
		t.Errorf("the broken provider saw %d calls, want 1 (then its credential is marked broken)", got)
	}

	// gpt-4o has no route: a 5xx exhausts its retries and dead-letters.
	res, err := cl.Do(ctx, &job.Job{Tenant: "acme", Request: ChatBody("gpt-4o", 5, 16)})
	if err != nil || res.Status != job.StatusDeadLettered || res.Attempts != 2 {
		t.Errorf("unrouted model: %+v %v, want dead_lettered after 2 attempts", res, err)
	}

	// A 400 never falls back: the request is wrong everywhere.
	before := backup.Stats().Completed
	res, err = cl.Do(ctx, &job.Job{Tenant: "acme", Request: ChatBody("strict-model", 5, 16)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != job.StatusFailed || res.Error == nil || res.Error.Code != "context_length_exceeded" || res.Attempts != 1 {
		t.Errorf("400: got %s %+v after %d attempts, want failed context_length_exceeded after 1", res.Status, res.Error, res.Attempts)
	}
	if backup.Stats().Completed != before || strictCalls.Load() != 1 {
		t.Errorf("400: backup completed %d more, strict saw %d calls; want no fallback and one call", backup.Stats().Completed-before, strictCalls.Load())
	}
	if got := primary.Stats().Requests[500]; got == 0 {
		t.Error("the primary never answered 500, so the provider_5xx fallback was not exercised")
	}
}

// TestLateExecutorGivesItsInstantBack: an executor late for a paced
// call's instant (here its clock runs a second ahead until a reservation
// has lapsed) sends nothing and returns the instant's budget, so the job is
// planned again at once. On a model allowed one request a minute, a kept
// instant would hold the job back a whole minute. The provider sees the
// one call, within its limit.
func TestLateExecutorGivesItsInstantBack(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 1, TPM: 1000000}}, APIKeys: []string{"sim-secret"}})
	// The executor's clock runs a second ahead until a reservation has
	// lapsed, however long the node takes to start.
	var ahead atomic.Bool
	ahead.Store(true)
	n := StartWith(t, SimConfig(simURL, "gpt-4o-mini", 1, 1000000, ""), Setup{Env: Env,
		Executor: func(c *executor.Config) {
			c.Now = func() time.Time {
				if ahead.Load() {
					return time.Now().Add(time.Second)
				}
				return time.Now()
			}
		}})
	nc, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		natstest.Poll(ctx, func() bool { return counterSum(n.Registry, "sluice_reservations_expired_total") > 0 })
		ahead.Store(false)
	}()
	res, err := cl.Do(ctx, &job.Job{Tenant: "acme", Request: ChatBody("gpt-4o-mini", 5, 16)})
	if err != nil || res.Status != job.StatusSucceeded {
		// What the model's schedule holds says which instant the job waits for.
		if js, jerr := jetstream.New(nc); jerr == nil {
			if kv, kerr := js.KeyValue(context.Background(), "budgets"); kerr == nil {
				if e, gerr := kv.Get(context.Background(), budget.ModelKey("sim", job.ModelToken("gpt-4o-mini"))); gerr == nil {
					t.Logf("schedule: %s", e.Value())
				}
			}
		}
		t.Fatalf("job: %+v %v (a lapsed instant kept its budget: the next one is a minute away)", res, err)
	}
	if m := metricValue(t, n.Registry, "sluice_reservations_expired_total"); m == 0 {
		t.Error("the executor was never late: the test proves nothing")
	}
	st := simSrv.Stats().Models["gpt-4o-mini"]
	if st.Admitted != 1 || st.RateLimited != 0 {
		t.Errorf("provider: %d admitted, %d refused; want the one call, admitted", st.Admitted, st.RateLimited)
	}
}

// metricValue sums a counter's series in a registry.
func metricValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	return counterSum(reg, name)
}

// counterSum sums a counter's series in a registry (0 if it cannot be
// read).
func counterSum(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
