package bench

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

// The batch scenario at a small scale: every figure is computed from what
// the runs did (not how fast): the provider's bill from the simulator's
// ledgers agrees with the results' costs, the lane run's batch jobs were
// billed as batch lines, and the interactive waits were read from the
// request log.
func TestBatchScenarioFigures(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three nodes")
	}
	t.Parallel()
	s := BatchSpec{RPM: 600, TPM: 60_000, Interactive: 12, Batch: 12, OfferFor: 3 * time.Second,
		PromptTokens: 120, MaxTokens: 40, OutputShare: 0.5, InteractiveDeadline: 30 * time.Second, BatchDeadline: 5 * time.Minute,
		SimBatch: time.Second, Collect: 500 * time.Millisecond, Poll: 200 * time.Millisecond, MinDeadline: time.Minute, Rescue: 30 * time.Second,
		InputPrice: 1, OutputPrice: 4, BatchFactor: 0.5}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	r, err := RunBatch(ctx, s, Options{RunTimeout: 40 * time.Second, TTFT: time.Millisecond, PerToken: 0})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Runs) != 3 {
		t.Fatalf("%d runs, want lane, all-sync and interactive-only", len(r.Runs))
	}
	for _, run := range r.Runs {
		want := s.Interactive + s.Batch
		if run.Name == BatchRunInteractiveOnly {
			want = s.Interactive
		}
		if run.Jobs != want || run.Succeeded != want || run.Missed != 0 {
			t.Errorf("%s: %d jobs, %d succeeded, %d deadlines missed; want %d, all met", run.Name, run.Jobs, run.Succeeded, run.Missed, want)
		}
		if got := run.SyncCalls + int64(run.BatchLines["succeeded"]); got != int64(run.Succeeded) {
			t.Errorf("%s: the provider billed %d sync calls + %d batch lines for %d jobs", run.Name, run.SyncCalls, run.BatchLines["succeeded"], run.Succeeded)
		}
		if run.BatchLines["succeeded"] != run.LaneJobs {
			t.Errorf("%s: %d batch lines succeeded, %d results from the lane", run.Name, run.BatchLines["succeeded"], run.LaneJobs)
		}
		if run.Cost <= 0 || math.Abs(run.Cost-run.SluiceCost) > 1e-9*run.Cost+1e-12 {
			t.Errorf("%s: the provider's bill %.9f, the results' costs %.9f; want equal and positive", run.Name, run.Cost, run.SluiceCost)
		}
		if run.WaitsLogged != s.Interactive {
			t.Errorf("%s: %d interactive queue waits read from the request log, want %d", run.Name, run.WaitsLogged, s.Interactive)
		}
	}
	lane, syn := r.Runs[0], r.Runs[1]
	if lane.LaneJobs < s.Batch*9/10 || syn.LaneJobs != 0 || syn.BatchLines["succeeded"] != 0 {
		t.Errorf("%d of %d batch jobs through the lane with it enabled, %d without; want nearly all, then none", lane.LaneJobs, s.Batch, syn.LaneJobs)
	}
	if math.Abs(r.BatchWorkLane-lane.BatchWorkCost) > 1e-9 || math.Abs(r.BatchWorkSync-syn.BatchWorkCost) > 1e-9 {
		t.Errorf("batch work by the bills %.9f (lane), %.9f (sync); by the results %.9f, %.9f", r.BatchWorkLane, r.BatchWorkSync, lane.BatchWorkCost, syn.BatchWorkCost)
	}
	if r.CostRatio <= 0 || r.CostRatio > BatchTarget.MaxCostRatio || r.TotalRatio <= r.CostRatio || r.TotalRatio >= 1 {
		t.Errorf("cost ratio %.3f (batch work), %.3f (whole bill); want the batch work near the batch factor and the whole between it and 1", r.CostRatio, r.TotalRatio)
	}
	var out strings.Builder
	WriteBatch(&out, r)
	for _, want := range []string{BatchRunLane, BatchRunSync, BatchRunInteractiveOnly, "target batch work"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	t.Log(out.String())
}

// The verdict: the cost ratio, a missed deadline of the lane run and an
// interactive p95 wait past the slack each fail it.
func TestBatchJudge(t *testing.T) {
	t.Parallel()
	base := func() *BatchResult {
		return &BatchResult{Runs: []*BatchRun{
			{Name: BatchRunLane, Cost: 1.5, WaitP95MS: 120},
			{Name: BatchRunSync, Cost: 2, WaitP95MS: 900, Missed: 3},
			{Name: BatchRunInteractiveOnly, Cost: 1, WaitP95MS: 100},
		}}
	}
	for _, tc := range []struct {
		name  string
		edit  func(r *BatchResult)
		miss  string
		ratio float64
	}{
		{"pass (the all-sync run's misses are reported, not judged)", func(*BatchResult) {}, "", 0.5},
		{"batch work too dear", func(r *BatchResult) { r.Runs[0].Cost = 1.6 }, "batch work cost", 0.6},
		{"a lane deadline missed", func(r *BatchResult) { r.Runs[0].Missed = 1 }, "lane: 0 failed, 0 unfinished, 1 deadlines missed", 0.5},
		{"interactive waits longer", func(r *BatchResult) { r.Runs[0].WaitP95MS = 151 }, "interactive p95 queue wait 151 ms > 150 ms", 0.5},
		{"relative slack above 50 ms", func(r *BatchResult) { r.Runs[2].WaitP95MS, r.Runs[0].WaitP95MS = 1000, 1099 }, "", 0.5},
	} {
		r := base()
		tc.edit(r)
		r.judge()
		if r.Pass != (tc.miss == "") || !strings.Contains(r.Why, tc.miss) || math.Abs(r.CostRatio-tc.ratio) > 1e-9 {
			t.Errorf("%s: pass %v (%s), ratio %.3f; want a miss naming %q, ratio %.2f", tc.name, r.Pass, r.Why, r.CostRatio, tc.miss, tc.ratio)
		}
	}
}
