package systest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/services/executor"
	"github.com/sluice-dev/sluice/services/lane"
	"github.com/sluice-dev/sluice/streams"
)

// laneConfig is a Sluice configuration for one simulated OpenAI model with
// its batch lane enabled (batch: the lane's YAML members) and a price, and
// the tenant acme.
func laneConfig(simURL string, rpm int, batch string) string {
	return fmt.Sprintf(`
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - name: gpt-4o-mini
        rpm: %d
        tpm: 10000000
        max_concurrency: 128
        price: {input_per_mtok: 1, output_per_mtok: 4, batch_factor: 0.5}
        batch: {enabled: true, %s}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
`, simURL, rpm, batch)
}

// runJobs submits n jobs of priority p (deadline in from now, 0: none)
// and waits for every result.
func runJobs(t *testing.T, ctx context.Context, cl *client.Client, n int, p job.Priority, in time.Duration) []*job.Result {
	t.Helper()
	return runModelJobs(t, ctx, cl, "gpt-4o-mini", n, p, in)
}

// runModelJobs is runJobs for model.
func runModelJobs(t *testing.T, ctx context.Context, cl *client.Client, model string, n int, p job.Priority, in time.Duration) []*job.Result {
	t.Helper()
	out := make([]*job.Result, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			j := &job.Job{Tenant: "acme", Priority: p, Request: ChatBody(model, 20+i%7, 16)}
			if in > 0 {
				d := time.Now().Add(in)
				j.Deadline = &d
			}
			res, err := cl.Do(ctx, j)
			if err != nil {
				errs <- err
				return
			}
			out[i] = res
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return out
}

// billed checks the provider billed each job exactly once: the sync calls
// it completed plus the batch lines that succeeded are the jobs, and each
// result says which lane it came from. It returns the results by lane.
func billed(t *testing.T, s *sim.Server, results []*job.Result) (batch, sync int) {
	t.Helper()
	lines := map[string]int{}
	for _, l := range s.BatchLines() {
		lines[l.Result]++
	}
	for _, r := range results {
		if r.Status != job.StatusSucceeded {
			t.Fatalf("job %s: %s %+v, want succeeded", r.JobID, r.Status, r.Error)
		}
		if r.Lane == job.LaneBatch {
			batch++
			if r.BatchID == "" || (r.Cost == nil && !r.CostUnpriced) {
				t.Errorf("job %s went through the lane without its batch id (%q) or cost", r.JobID, r.BatchID)
			}
			continue
		}
		sync++
	}
	if lines["succeeded"] != batch {
		t.Errorf("the provider billed %d batch lines, and %d results came from a batch", lines["succeeded"], batch)
	}
	if got := s.Stats().Completed; got != int64(sync) {
		t.Errorf("the provider completed %d synchronous calls, and %d results came from them", got, sync)
	}
	t.Logf("%d results from batch lines (%v lines by result), %d synchronous", batch, lines, sync)
	return batch, sync
}

// Batch-priority jobs with a distant deadline go through the lane, at the
// batch price; interactive jobs keep the synchronous lane and its limits.
func TestBatchLaneTakesBatchWork(t *testing.T) {
	t.Parallel()
	s, url := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 10000000}}, APIKeys: []string{"sim-secret"},
		Batch: sim.BatchConfig{Duration: time.Second}})
	n := StartLogged(t, laneConfig(url, 600, "collect: 500ms, min_deadline: 1m, rescue: 30s, poll: 100ms"), Env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second) // 320 jobs; a few seconds on a quiet machine
	defer cancel()
	var lane, inter []*job.Result
	var wg sync.WaitGroup
	wg.Go(func() { lane = runJobs(t, ctx, cl, 300, job.Batch, time.Hour) })
	wg.Go(func() { inter = runJobs(t, ctx, cl, 20, job.Interactive, 0) })
	wg.Wait()
	if t.Failed() {
		return
	}
	batch, _ := billed(t, s, append(lane, inter...))
	if batch < 285 {
		t.Errorf("%d of 300 batch jobs went through the lane, want at least 95%%", batch)
	}
	for _, r := range inter {
		if r.Lane != job.LaneSync {
			t.Errorf("interactive job %s went through lane %q", r.JobID, r.Lane)
		}
	}
	// The synchronous lane keeps the limits: the provider never accepted
	// more than its per-second cap. A call that a loaded machine delivers
	// past send_tolerance may still meet a full second and be refused (it
	// spends no attempt); one such refusal in 20 calls is jitter, more is
	// a plan that broke the cap (held to none by the benchmarks).
	if st := s.Stats().Models["gpt-4o-mini"]; st.RateLimited > 1 || st.Admitted < 20 || st.MaxAdmittedRequestsIn1s > st.BurstRequests {
		t.Errorf("the synchronous lane: %d admitted (at most %d in a second, cap %d), %d rate-limited; want the 20 interactive calls within the cap",
			st.Admitted, st.MaxAdmittedRequestsIn1s, st.BurstRequests, st.RateLimited)
	}
	if r := lane[0]; r.Lane == job.LaneBatch {
		u := r.Usage
		want := (float64(u.PromptTokens)*1 + float64(u.CompletionTokens)*4) / 1e6 / 2
		if d := *r.Cost - want; d > 1e-12 || d < -1e-12 {
			t.Errorf("a batch line cost %g, want %g (half the synchronous price)", *r.Cost, want)
		}
	}
	if r := lane[0]; r.Lane == job.LaneBatch {
		got := fmt.Sprint(GetJob(t, ctx, n.HTTP, Env["ACME_KEY"], r.JobID, ""))
		if !strings.Contains(got, "lane:batch") || !strings.Contains(got, "batch_id:"+r.BatchID) {
			t.Errorf("GET /v1/jobs/%s = %s, want its lane and batch id", r.JobID, got)
		}
	}
	if got := MetricSum(t, n.MetricsURL(), "sluice_lane_jobs_total", `outcome="batch"`); got != float64(batch) {
		t.Errorf("sluice_lane_jobs_total{outcome=batch} = %g, want %d", got, batch)
	}
}

// A batch slower than its jobs' deadlines is cancelled rescue before the
// earliest, the cancellation awaited: the lines it finished are results,
// the rest run synchronously, and every job succeeds once, in time.
func TestBatchLaneRescue(t *testing.T) {
	t.Parallel()
	s, url := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 6000, TPM: 10000000}}, APIKeys: []string{"sim-secret"},
		Batch: sim.BatchConfig{Duration: 60 * time.Second}})
	// Deadlines 20 s away: rescued 8 s before, a fifth of the batch done;
	// margins a loaded machine keeps.
	n := StartLogged(t, laneConfig(url, 6000, "collect: 1s, min_deadline: 12s, rescue: 8s, poll: 100ms"), Env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const deadline = 20 * time.Second
	results := runJobs(t, ctx, cl, 30, job.Batch, deadline)
	if t.Failed() {
		return
	}
	batch, sync := billed(t, s, results)
	if batch == 0 || sync == 0 {
		t.Errorf("%d results from the batch and %d synchronous, want some of each (the finished lines kept, the rest rescued)", batch, sync)
	}
	cancelled := 0
	for _, l := range s.BatchLines() {
		if l.Result == "canceled" {
			cancelled++
		}
	}
	if cancelled != sync {
		t.Errorf("%d lines cancelled, %d jobs run synchronously: want the cancelled ones, and only them", cancelled, sync)
	}
	for _, r := range results {
		if r.CompletedAt.After(r.SubmittedAt.Add(deadline)) {
			t.Errorf("job %s completed %s after its submission, past its deadline", r.JobID, r.CompletedAt.Sub(r.SubmittedAt))
		}
	}
	// One batch, or more where the jobs came in over more than collect.
	if got := MetricSum(t, n.MetricsURL(), "sluice_lane_batches_total", `state="rescued"`); got < 1 {
		t.Errorf("sluice_lane_batches_total{state=rescued} = %g, want at least 1", got)
	}
}

// The process holding a lane's open batch is lost: another takes the
// lane's lease, finds the batch in KV, follows it and maps its lines back.
// No job is submitted in a second batch, none runs synchronously.
func TestBatchLaneSurvivesItsOwner(t *testing.T) {
	t.Parallel()
	s, url := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 10000000}}, APIKeys: []string{"sim-secret"},
		Batch: sim.BatchConfig{Duration: 4 * time.Second}})
	cfg := laneConfig(url, 600, "collect: 300ms, min_deadline: 1m, rescue: 30s, poll: 100ms")
	front := StartWith(t, cfg, Setup{Env: Env, Services: []string{"ingest", "admission", "result"}})
	WaitReady(t, front.HTTP)
	nc, cl := front.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "budgets")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	StartWith(t, cfg, Setup{Env: Env, NATSURL: front.NATS, Data: front.Data, Services: []string{"executor"}, Stop: stop})
	natstest.Eventually(t, 20*time.Second, func() error { // the first executor holds the lane
		_, err := kv.Get(ctx, "lane.sim.gpt-4o-mini.lease")
		return err
	})
	heir := StartWith(t, cfg, Setup{Env: Env, NATSURL: front.NATS, Data: front.Data, Services: []string{"executor"}})
	var results []*job.Result
	done := make(chan struct{})
	go func() {
		defer close(done)
		results = runJobs(t, ctx, cl, 40, job.Batch, time.Hour)
	}()
	natstest.Eventually(t, 20*time.Second, func() error { // a batch is running at the provider
		keys, err := kv.ListKeysFiltered(ctx, "lane.sim.gpt-4o-mini.batch.>")
		if err != nil {
			return err
		}
		for k := range keys.Keys() {
			e, err := kv.Get(ctx, k)
			if err == nil && strings.Contains(string(e.Value()), `"state":"running"`) {
				return nil
			}
		}
		return fmt.Errorf("no running batch yet")
	})
	open, err := lane.OpenBatches(ctx, kv, time.Now()) // what `sluice queue` shows
	if err != nil || len(open) == 0 || open[0].Lane != "sim.gpt-4o-mini" || open[0].Lines == 0 {
		t.Errorf("open batches: %+v, %v; want the running one", open, err)
	}
	close(stop) // the lane's holder is lost, its batch running
	<-done
	if t.Failed() {
		return
	}
	batch, sync := billed(t, s, results)
	if batch != 40 || sync != 0 {
		t.Errorf("%d results from the batch and %d synchronous, want all 40 from it", batch, sync)
	}
	if lines := len(s.BatchLines()); lines != 40 {
		t.Errorf("the provider ran %d batch lines for 40 jobs, want each job in one batch", lines)
	}
	if got := MetricSum(t, heir.MetricsURL(), "sluice_lane_jobs_total", `outcome="batch"`); got != 40 {
		t.Errorf("the heir mapped %g lines back, want all 40", got)
	}
}

// The enqueued-token budget makes jobs wait for room, never fail: the
// lane sends batches within it, one after another.
func TestBatchLaneEnqueuedTokenLimit(t *testing.T) {
	t.Parallel()
	s, url := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 10000000}}, APIKeys: []string{"sim-secret"},
		Batch: sim.BatchConfig{Duration: 500 * time.Millisecond, EnqueuedTokens: 600}})
	n := StartLogged(t, laneConfig(url, 600, "collect: 200ms, min_deadline: 1m, rescue: 30s, poll: 100ms, enqueued_tokens: 600"), Env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	results := runJobs(t, ctx, cl, 60, job.Batch, time.Hour)
	if t.Failed() {
		return
	}
	batch, _ := billed(t, s, results)
	if batch != 60 {
		t.Errorf("%d of 60 jobs went through the lane, want all (waiting for room)", batch)
	}
	ids := map[string]bool{}
	for _, l := range s.BatchLines() {
		ids[l.BatchID] = true
	}
	if len(ids) < 3 {
		t.Errorf("%d batches, want several within the budget", len(ids))
	}
	if got := MetricSum(t, n.MetricsURL(), "sluice_lane_waits_total"); got == 0 {
		t.Error("sluice_lane_waits_total = 0, want the jobs to have waited for room")
	}
}

// loseCreate is a transport that delivers the first batch create to the
// provider and then loses its answer, as a timeout would.
type loseCreate struct {
	once sync.Once
}

func (l *loseCreate) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil || r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/batches") {
		return resp, err
	}
	lost := false
	l.once.Do(func() { lost = true })
	if !lost {
		return resp, nil
	}
	resp.Body.Close()
	return nil, fmt.Errorf("the answer was lost (test)")
}

// A batch create whose answer is lost is found again by its key, and
// followed: its jobs are never submitted in a second batch.
func TestBatchLaneLostCreateAnswer(t *testing.T) {
	t.Parallel()
	s, url := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 10000000}}, APIKeys: []string{"sim-secret"},
		Batch: sim.BatchConfig{Duration: time.Second}})
	var log SyncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node log:\n%s", log.String())
		}
	})
	lose := &loseCreate{}
	n := StartWith(t, laneConfig(url, 600, "collect: 300ms, min_deadline: 1m, rescue: 30s, poll: 100ms"),
		Setup{Env: Env, Log: &log, Level: slog.LevelInfo, Executor: func(c *executor.Config) { c.Transport = lose }})
	WaitReady(t, n.HTTP)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	results := runJobs(t, ctx, cl, 20, job.Batch, time.Hour)
	if t.Failed() {
		return
	}
	batch, sync := billed(t, s, results)
	if lines := len(s.BatchLines()); batch != 20 || sync != 0 || lines != 20 {
		t.Errorf("%d results from %d batch lines, %d synchronous; want all 20 from the batch created, each job in one batch", batch, lines, sync)
	}
	lost := false
	lose.once.Do(func() { lost = true })
	if lost {
		t.Error("no batch create was made")
	}
}

// Anthropic's Message Batches through the lane: a batch the provider's
// processing queue refuses (429) is taken back, its jobs wait, and the
// next batch is smaller; every job still goes through the lane.
func TestBatchLaneAnthropicQueueFull(t *testing.T) {
	t.Parallel()
	const model = "claude-3-5-haiku-latest"
	s, url := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 600, ITPM: 1000000, OTPM: 1000000}}, APIKeys: []string{"sim-secret"},
		Batch: sim.BatchConfig{Duration: 300 * time.Millisecond, QueueRequests: 8}})
	n := StartLogged(t, fmt.Sprintf(`
providers:
  - name: claude
    kind: anthropic
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - name: %s
        rpm: 600
        itpm: 1000000
        otpm: 1000000
        batch: {enabled: true, collect: 200ms, min_deadline: 1m, rescue: 30s, poll: 100ms}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
`, url, model), Env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	results := runModelJobs(t, ctx, cl, model, 30, job.Batch, time.Hour)
	if t.Failed() {
		return
	}
	if batch, _ := billed(t, s, results); batch != 30 {
		t.Errorf("%d of 30 jobs went through the lane, want all", batch)
	}
	if got := MetricSum(t, n.MetricsURL(), "sluice_lane_batches_total", `state="refused"`); got == 0 {
		t.Error("no batch was refused for the queue, want the first (30 requests, the queue holds 8)")
	}
}

// A job its caller cancels while the lane holds it, before its batch is
// sent, is never submitted: the batch that goes has no line for it, its
// result is cancelled, and every other job succeeds from the batch.
func TestBatchLaneCancelBeforeSubmit(t *testing.T) {
	t.Parallel()
	s, url := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 10000000}}, APIKeys: []string{"sim-secret"},
		Batch: sim.BatchConfig{Duration: 500 * time.Millisecond}})
	n := StartLogged(t, laneConfig(url, 600, "collect: 5s, min_deadline: 1m, rescue: 30s, poll: 100ms"), Env)
	nc, cl := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	const jobs = 10
	ids := make([]string, 0, jobs)
	for i := range jobs {
		id, err := cl.Submit(ctx, &job.Job{Tenant: "acme", Priority: job.Batch, Request: ChatBody("gpt-4o-mini", 20+i, 16)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	natstest.Eventually(t, 10*time.Second, func() error { // the lane holds every job, none in a batch yet
		cons, err := js.Consumer(ctx, streams.Lane, "lane-sim-gpt-4o-mini")
		if err != nil {
			return err
		}
		info, err := cons.Info(ctx)
		if err == nil && (info.NumAckPending != jobs || len(s.BatchLines()) != 0) {
			err = fmt.Errorf("the lane holds %d jobs", info.NumAckPending)
		}
		return err
	})
	victim := ids[jobs/2]
	acme := client.NewJobs(n.HTTP, Env["ACME_KEY"])
	natstest.Eventually(t, 10*time.Second, func() error {
		got, accepted, err := acme.Cancel(ctx, victim)
		if err != nil {
			return err // not recorded yet
		}
		if accepted || got.Status != job.StatusCancelled {
			t.Fatalf("cancel of a job the lane holds: %+v (accepted %v), want cancelled", got, accepted)
		}
		return nil
	})
	var results []*job.Result
	for _, id := range ids {
		var r *job.Result
		natstest.Eventually(t, 30*time.Second, func() error {
			var err error
			if r, err = cl.Lookup(ctx, "acme", id); err == nil && r == nil {
				err = fmt.Errorf("job %s has no result yet", id)
			}
			return err
		})
		if id == victim {
			if r.Status != job.StatusCancelled {
				t.Errorf("the cancelled job ended %s (lane %q), want cancelled", r.Status, r.Lane)
			}
			continue
		}
		results = append(results, r)
	}
	if batch, _ := billed(t, s, results); batch != jobs-1 {
		t.Errorf("%d of %d jobs not cancelled came from the batch, want all", batch, jobs-1)
	}
	if lines := len(s.BatchLines()); lines != jobs-1 {
		t.Errorf("the provider ran %d batch lines, want %d: none for the cancelled job", lines, jobs-1)
	}
	if got := MetricSum(t, n.MetricsURL(), "sluice_lane_jobs_total", `outcome="batch"`); got != jobs-1 {
		t.Errorf("sluice_lane_jobs_total{outcome=batch} = %g, want %d", got, jobs-1)
	}
	if got := MetricSum(t, n.MetricsURL(), "sluice_lane_jobs_total", `outcome="sync"`); got != 0 {
		t.Errorf("sluice_lane_jobs_total{outcome=sync} = %g, want 0: the cancelled job is dropped, not sent to the normal lane", got)
	}
}

// The lane takes no spend hold: a tenant with a spend budget keeps its
// batch-priority jobs in the normal lane, where the budget holds.
func TestBatchLaneSpendBudgetedTenant(t *testing.T) {
	t.Parallel()
	s, url := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 10000000}}, APIKeys: []string{"sim-secret"},
		Batch: sim.BatchConfig{Duration: 200 * time.Millisecond}})
	cfg := strings.Replace(laneConfig(url, 600, "collect: 200ms, min_deadline: 1m, rescue: 30s, poll: 100ms"),
		"{name: acme, api_key_env: ACME_KEY}", "{name: acme, api_key_env: ACME_KEY, spend: {per_day: 100}}", 1)
	n := StartLogged(t, cfg, Env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	results := runJobs(t, ctx, cl, 5, job.Batch, time.Hour)
	if t.Failed() {
		return
	}
	if batch, sync := billed(t, s, results); batch != 0 || sync != 5 {
		t.Errorf("%d results from batch lines, %d synchronous; want every job of a spend-budgeted tenant in the normal lane", batch, sync)
	}
}

// TestBatchLaneReloadGivesSpendBudget: jobs collected in the lane whose
// tenant a reload then gives a spend budget leave the lane for the normal
// one (where the spend gate holds) instead of waiting for their batch.
// Their batch is an hour off (collect: 1h): on the old code they waited
// for it and the test runs out of time.
func TestBatchLaneReloadGivesSpendBudget(t *testing.T) {
	t.Parallel()
	s, url := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 10000000}}, APIKeys: []string{"sim-secret"},
		Batch: sim.BatchConfig{Duration: 200 * time.Millisecond}})
	before := laneConfig(url, 600, "collect: 1h, min_deadline: 1m, rescue: 30s, poll: 100ms")
	after := strings.Replace(before, "{name: acme, api_key_env: ACME_KEY}", "{name: acme, api_key_env: ACME_KEY, spend: {per_day: 100}}", 1)
	var mu sync.Mutex
	yaml := before
	load := func() (*config.Config, string, error) {
		mu.Lock()
		defer mu.Unlock()
		c, err := config.Parse([]byte(yaml))
		if err != nil {
			return nil, "", err
		}
		c.Server.Metrics = "127.0.0.1:0" // as StartWith sets it
		return c, fmt.Sprint(len(yaml)), nil
	}
	reloads := make(chan string)
	var log SyncBuffer
	n := StartWith(t, before, Setup{Env: Env, Log: &log, Level: slog.LevelInfo, Load: load, Reloads: reloads})
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const jobs = 3
	done := make(chan []*job.Result, 1)
	go func() { done <- runJobs(t, ctx, cl, jobs, job.Batch, 2*time.Hour) }()
	natstest.Eventually(t, 30*time.Second, func() error {
		if got := MetricSum(t, n.MetricsURL(), "sluice_lane_jobs_total", `outcome="diverted"`); got < jobs {
			return fmt.Errorf("%v of %d jobs in the lane", got, jobs)
		}
		return nil
	})
	mu.Lock()
	yaml = after
	mu.Unlock()
	select {
	case reloads <- "test":
	case <-ctx.Done():
		t.Fatal("the node did not take the reload request")
	}
	var results []*job.Result
	select {
	case results = <-done:
	case <-ctx.Done():
		t.Fatalf("the jobs stayed in the lane after their tenant was given a spend budget")
	}
	if t.Failed() {
		return
	}
	if batch, sync := billed(t, s, results); batch != 0 || sync != jobs {
		t.Errorf("%d results from batch lines, %d synchronous; want every job back in the normal lane", batch, sync)
	}
	if !strings.Contains(log.String(), "no longer for the batch lane") {
		t.Error("no log line says why the jobs left the lane")
	}
}
