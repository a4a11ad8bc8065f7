package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestChaos runs 2,000 jobs while the provider fails 10 % of calls with
// 5xx, resets 5 % and hangs 2 %, and executor processes are killed with
// SIGKILL and restarted. Every job must end with exactly one result; jobs
// whose every attempt failed must be dead-lettered with a reason; no
// operation may be completed twice by the provider.
func TestChaos(t *testing.T) {
	t.Parallel()
	bin := sluiceBinary(t)
	const model, jobs = "gpt-4o-mini", 2000
	simSrv, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 100000, TPM: 50000000}},
		TTFT: 30 * time.Millisecond, APIKeys: []string{"sim-secret"},
		Faults: sim.Faults{Seed: 7, Rate500: 0.04, Rate502: 0.03, Rate503: 0.03, RateReset: 0.05, RateHang: 0.02, HangFor: 5 * time.Second}})
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "sluice.yaml")
	cfg := fmt.Sprintf(`
server: {open: true}
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    timeout: 1s
    models: [{name: %s, max_concurrency: 64}]
tenants:
  - {name: acme}
  - {name: globex}
retry:
  interactive: {max_attempts: 3, max_elapsed: 30s, base_delay: 50ms, max_delay: 500ms}
  standard: {max_attempts: 4, max_elapsed: 60s, base_delay: 50ms, max_delay: 500ms}
  batch: {max_attempts: 2, max_elapsed: 60s, base_delay: 50ms, max_delay: 500ms}
`, simURL, model)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	front := startChild(t, bin, []string{"--config", cfgPath, "--data", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0",
		"--http", "127.0.0.1:0", "--services", "ingest,admission,result"}, systest.Env)
	execArgs := []string{"--config", cfgPath, "--nats-url", front.NATS, "--data", filepath.Join(dir, "data"), "--http", "127.0.0.1:0", "--services", "executor"}
	executors := []*child{startChild(t, bin, execArgs, systest.Env), startChild(t, bin, execArgs, systest.Env)}
	nc, cl := front.Connect(t)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	ids := make([]string, 0, jobs)
	for i := range jobs {
		j := &job.Job{Tenant: []string{"acme", "globex"}[i%2], Priority: []job.Priority{job.Interactive, job.Standard, job.Batch}[i%3],
			Request: systest.ChatBody(model, 5+i%20, 32)}
		id, err := cl.Submit(ctx, j)
		if err != nil {
			t.Fatalf("submit #%d: %v", i, err)
		}
		ids = append(ids, id)
	}
	// Kill an executor with SIGKILL at random moments and start a new one.
	rnd := rand.New(rand.NewPCG(1, 2))
	kills := 0
	var mu sync.Mutex
	for kills < 6 {
		// Scenario time: chaos strikes at random moments, whatever the
		// executors are doing then.
		time.Sleep(time.Duration(800+rnd.IntN(1500)) * time.Millisecond)
		i := rnd.IntN(len(executors))
		_ = executors[i].cmd.Process.Signal(syscall.SIGKILL)
		_ = executors[i].cmd.Wait()
		kills++
		mu.Lock()
		executors[i] = startChild(t, bin, execArgs, systest.Env)
		mu.Unlock()
	}
	t.Logf("killed executors %d times; provider completed %d calls so far", kills, simSrv.Stats().Completed)

	statuses := map[job.Status]int{}
	var failed []*job.Result
	for i, id := range ids {
		var r *job.Result
		if !natstest.Poll(ctx, func() bool {
			var err error
			r, err = cl.Lookup(ctx, []string{"acme", "globex"}[i%2], id)
			return err == nil && r != nil
		}) {
			t.Fatalf("job %s has no result", id)
		}
		statuses[r.Status]++
		if r.Status != job.StatusSucceeded {
			failed = append(failed, r)
		}
	}
	// Exactly one stored result per job.
	st, _ := js.Stream(ctx, "RESULTS")
	info, _ := st.Info(ctx)
	if info.State.Msgs != uint64(jobs) {
		t.Errorf("RESULTS holds %d results for %d jobs", info.State.Msgs, jobs)
	}
	ss := simSrv.Stats()
	dead, _ := dlq.List(ctx, js, dlq.Filter{})
	reasons := map[string]int{}
	for _, e := range dead {
		reasons[e.Reason]++
	}
	t.Logf("results %v; dead letters %d by reason %v", statuses, len(dead), reasons)
	t.Logf("provider: %d completed, %d replayed, %d resets, %d hangs, %d duplicate completions, requests by status %v",
		ss.Completed, ss.Replayed, ss.ConnResets, ss.Hangs, ss.DuplicateCompletions, ss.Requests)
	if ss.DuplicateCompletions != 0 {
		t.Errorf("provider completed %d operations twice", ss.DuplicateCompletions)
	}
	// Every job that did not succeed was dead-lettered; a tenant keeps its
	// newest dlq.PerTenant dead letters (one tenant's flood must not evict
	// another's), so past that its oldest are trimmed.
	failedBy, deadBy := map[string]int{}, map[string]int{}
	for _, r := range failed {
		failedBy[r.Tenant]++
	}
	for _, r := range failed {
		if failedBy[r.Tenant] > dlq.PerTenant {
			continue // some of its dead letters were trimmed
		}
		e, err := dlq.Get(ctx, js, r.Tenant, r.JobID)
		if err != nil || e.Reason == "" || len(e.Job.Attempts) == 0 {
			t.Errorf("job %s ended %s but its dead letter is %+v (%v)", r.JobID, r.Status, e, err)
		}
	}
	for _, e := range dead {
		deadBy[e.Job.Tenant]++
	}
	for _, tenant := range []string{"acme", "globex"} {
		if want := min(failedBy[tenant], dlq.PerTenant); deadBy[tenant] != want {
			t.Errorf("tenant %s: %d jobs did not succeed, %d dead letters kept, want %d", tenant, failedBy[tenant], deadBy[tenant], want)
		}
	}
}
