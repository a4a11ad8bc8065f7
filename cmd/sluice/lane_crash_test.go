package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestBatchLaneOwnerKilled SIGKILLs the `sluice up` process that holds a
// model's batch lane while its batch runs at the provider: the other
// process takes the lane's lease, finds the batch in KV, follows it and
// maps its lines back. Every job succeeds once, from a batch line; no
// job is submitted in a second batch, none runs synchronously.
func TestBatchLaneOwnerKilled(t *testing.T) {
	t.Parallel()
	bin := sluiceBinary(t)
	const model, jobs = "gpt-4o-mini", 40
	simSrv, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 600, TPM: 10000000}}, APIKeys: []string{"sim-secret"},
		Batch: sim.BatchConfig{Duration: 4 * time.Second}})
	ns := natstest.Server(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	yaml := fmt.Sprintf(`
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - name: %s
        rpm: 600
        tpm: 10000000
        batch: {enabled: true, collect: 300ms, min_deadline: 1m, rescue: 30s, poll: 100ms}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
`, simURL, model)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	args := func(services string) []string {
		return []string{"--config", cfg, "--nats-url", ns.ClientURL(), "--http", "127.0.0.1:0", "--services", services, "--log-level", "debug"}
	}
	front := startChild(t, bin, args("ingest,admission,result"), systest.Env)
	a, b := spawnChild(t, bin, args("executor"), systest.Env), spawnChild(t, bin, args("executor"), systest.Env)
	lanes := []*child{a(), b()}

	nc, cl := front.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "budgets")
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, jobs)
	for i := range jobs {
		id, err := cl.Submit(ctx, &job.Job{Tenant: "acme", Priority: job.Batch, Request: systest.ChatBody(model, 20+i%7, 16)})
		if err != nil {
			t.Fatalf("submit #%d: %v", i, err)
		}
		ids = append(ids, id)
	}
	running := func() bool { // a batch holding every job runs at the provider
		keys, err := kv.ListKeysFiltered(ctx, "lane.sim."+model+".batch.>")
		if err != nil {
			return false
		}
		for k := range keys.Keys() {
			e, err := kv.Get(ctx, k)
			if err == nil && strings.Contains(string(e.Value()), `"state":"running"`) {
				return true
			}
		}
		return false
	}
	if !natstest.Poll(ctx, running) {
		t.Fatal("no batch running at the provider")
	}
	e, err := kv.Get(ctx, "lane.sim."+model+".lease")
	if err != nil {
		t.Fatal(err)
	}
	var lease struct{ Holder string }
	_ = json.Unmarshal(e.Value(), &lease)
	var owner *child
	for _, c := range lanes {
		if strings.Contains(lease.Holder, fmt.Sprintf("-%d-", c.cmd.Process.Pid)) {
			owner = c
		}
	}
	if owner == nil {
		t.Fatalf("the lease's holder %q is neither process", lease.Holder)
	}
	if err := owner.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = owner.cmd.Wait()
	if n := len(simSrv.BatchLines()); n != 0 {
		t.Fatalf("%d batch lines ended before the kill; the test proves nothing", n)
	}

	batches := map[string]bool{}
	for _, id := range ids {
		var r *job.Result
		if !natstest.Poll(ctx, func() bool {
			r, err = cl.Lookup(ctx, "acme", id)
			return err == nil && r != nil
		}) {
			t.Fatalf("job %s has no result after the kill", id)
		}
		if r.Status != job.StatusSucceeded || r.Lane != job.LaneBatch {
			t.Errorf("job %s ended %s through lane %q (%+v), want succeeded from the batch", id, r.Status, r.Lane, r.Error)
		}
		batches[r.BatchID] = true
	}
	lines := simSrv.BatchLines()
	billedIn := map[string]bool{}
	for _, l := range lines {
		billedIn[l.BatchID] = true
	}
	if len(lines) != jobs || len(billedIn) != len(batches) {
		t.Errorf("the provider ran %d lines in %d batches for %d jobs (results from %d batches), want each job billed once", len(lines), len(billedIn), jobs, len(batches))
	}
	if n := simSrv.Stats().Completed; n != 0 {
		t.Errorf("the provider completed %d synchronous calls, want none", n)
	}
}
