package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// The batch scenario (issue 38): one priced model whose synchronous RPM
// and TPM bind, and a mixed workload: interactive jobs arriving steadily,
// and as many batch-priority jobs of the same shape (so half the work by
// tokens) handed over at once with a distant deadline. The same jobs run
// three times, each against a fresh simulator and a fresh node: with the
// model's batch lane enabled, with it disabled (all synchronous), and the
// interactive jobs alone. The provider's bill is read from the simulator's
// ledgers (its synchronous completions and its batch lines) at the model's
// price, batch lines at the batch factor.

// BatchSpec shapes the batch scenario.
type BatchSpec struct {
	// RPM and TPM are the model's synchronous limits (the simulator's and
	// Sluice's).
	RPM int `json:"rpm"`
	TPM int `json:"tpm"`
	// Interactive jobs arrive evenly over OfferFor; Batch jobs (same
	// shape) are handed over at once at the start.
	Interactive int           `json:"interactive"`
	Batch       int           `json:"batch"`
	OfferFor    time.Duration `json:"offer_for"`
	// PromptTokens and MaxTokens shape every job; the simulator answers
	// with OutputShare of MaxTokens.
	PromptTokens int     `json:"prompt_tokens"`
	MaxTokens    int     `json:"max_tokens"`
	OutputShare  float64 `json:"output_share"`
	// InteractiveDeadline and BatchDeadline are the jobs' deadlines from
	// their submission.
	InteractiveDeadline time.Duration `json:"interactive_deadline"`
	BatchDeadline       time.Duration `json:"batch_deadline"`
	// SimBatch is how long the simulator takes over one batch; Collect,
	// Poll, MinDeadline and Rescue the lane's configuration.
	SimBatch    time.Duration `json:"sim_batch"`
	Collect     time.Duration `json:"collect"`
	Poll        time.Duration `json:"poll"`
	MinDeadline time.Duration `json:"min_deadline"`
	Rescue      time.Duration `json:"rescue"`
	// InputPrice and OutputPrice are per million tokens; BatchFactor the
	// share of them a batch line pays.
	InputPrice  float64 `json:"input_per_mtok"`
	OutputPrice float64 `json:"output_per_mtok"`
	BatchFactor float64 `json:"batch_factor"`
}

// DefaultBatch is the scenario as `sluice bench batch` runs it: jobs of
// ~200 prompt + 100 max tokens (~340 as the simulator charges them), 150
// interactive over a minute (~40 % of TPM) and 150 batch at once.
var DefaultBatch = BatchSpec{RPM: 1000, TPM: 120_000, Interactive: 150, Batch: 150, OfferFor: time.Minute,
	PromptTokens: 200, MaxTokens: 100, OutputShare: 0.6, InteractiveDeadline: time.Minute, BatchDeadline: 10 * time.Minute,
	SimBatch: 20 * time.Second, Collect: 2 * time.Second, Poll: time.Second, MinDeadline: 5 * time.Minute, Rescue: time.Minute,
	InputPrice: 0.15, OutputPrice: 0.6, BatchFactor: 0.5}

// BatchTarget is what the lane must achieve: the batch work's cost at most
// MaxCostRatio of its all-synchronous cost, every deadline met, and the
// interactive p95 queue wait no worse than with no batch work at all, up
// to WaitSlack (relative) or WaitSlackMS (absolute), whichever is larger.
var BatchTarget = struct {
	MaxCostRatio, WaitSlack, WaitSlackMS float64
}{0.55, 0.10, 50}

// The three runs.
const (
	BatchRunLane            = "lane"
	BatchRunSync            = "all-sync"
	BatchRunInteractiveOnly = "interactive-only"
)

// BatchRun is one run's figures.
type BatchRun struct {
	Name      string `json:"name"`
	Jobs      int    `json:"jobs"`
	Succeeded int    `json:"succeeded"`
	Failed    int    `json:"failed"`
	// Unfinished jobs had no result by the run's deadline; Missed jobs
	// ended after their deadline or did not succeed.
	Unfinished int `json:"unfinished"`
	Missed     int `json:"deadlines_missed"`
	// SyncCalls are the simulator's completed synchronous calls, Refused
	// its 429s; BatchLines its batch lines by result.
	SyncCalls  int64          `json:"sync_calls"`
	Refused    int64          `json:"refused_429"`
	BatchLines map[string]int `json:"batch_lines"`
	// LaneJobs are the results that came from a batch line.
	LaneJobs int `json:"lane_jobs"`
	// Cost is the provider's bill: synchronous usage at list price plus
	// succeeded batch lines at the batch factor; SluiceCost the sum of the
	// results' cost, and BatchWorkCost Sluice's cost of the batch jobs.
	Cost          float64 `json:"cost"`
	SluiceCost    float64 `json:"sluice_cost"`
	BatchWorkCost float64 `json:"sluice_batch_work_cost"`
	// WaitP50MS and WaitP95MS are the interactive jobs' queue waits (the
	// request log's queue_wait_ms: acceptance to the first call).
	WaitP50MS float64 `json:"interactive_wait_p50_ms"`
	WaitP95MS float64 `json:"interactive_wait_p95_ms"`
	// WaitsLogged counts the interactive jobs whose request log line was
	// read (the waits are theirs).
	WaitsLogged int     `json:"interactive_waits_logged"`
	WallS       float64 `json:"wall_s"`
}

// BatchResult is the scenario's outcome.
type BatchResult struct {
	Spec BatchSpec   `json:"spec"`
	Runs []*BatchRun `json:"runs"` // lane, all-sync, interactive-only
	// BatchWorkLane and BatchWorkSync are the provider's bill for the
	// batch jobs: each run's bill less the interactive-only run's (the
	// same interactive jobs, answered alike); CostRatio their ratio and
	// TotalRatio the whole bills'.
	BatchWorkLane float64 `json:"batch_work_cost_lane"`
	BatchWorkSync float64 `json:"batch_work_cost_sync"`
	CostRatio     float64 `json:"cost_ratio"`
	TotalRatio    float64 `json:"total_cost_ratio"`
	WallS         float64 `json:"wall_s"`
	Pass          bool    `json:"pass"`
	Why           string  `json:"why,omitempty"`
}

// batchJob is one job of the scenario: its body, class and when it is
// handed over (from the run's start).
type batchJob struct {
	Job
	priority job.Priority
	at       time.Duration
	deadline time.Duration
}

// batchJobs are the scenario's jobs: the interactive ones first.
func batchJobs(s BatchSpec, seed uint64) ([]batchJob, error) {
	rnd := rand.New(rand.NewPCG(seed, seedFor("batch")))
	var out []batchJob
	for i := range s.Interactive + s.Batch {
		j, err := newJob(rnd, s.PromptTokens, s.MaxTokens)
		if err != nil {
			return nil, err
		}
		bj := batchJob{Job: j, priority: job.Batch, deadline: s.BatchDeadline}
		if i < s.Interactive {
			bj.priority, bj.deadline = job.Interactive, s.InteractiveDeadline
			bj.at = time.Duration(i) * s.OfferFor / time.Duration(max(s.Interactive, 1))
		}
		out = append(out, bj)
	}
	return out, nil
}

// RunBatch runs the scenario's three runs and judges them.
func RunBatch(ctx context.Context, s BatchSpec, opt Options) (*BatchResult, error) {
	opt = opt.withDefaults()
	if s.Interactive < 1 || s.Batch < 1 || s.RPM < 1 || s.TPM < 1 || s.OfferFor <= 0 || s.MaxTokens < 1 {
		return nil, fmt.Errorf("batch scenario: want interactive and batch jobs, limits, an offer window and max tokens")
	}
	began := time.Now()
	jobs, err := batchJobs(s, opt.Seed)
	if err != nil {
		return nil, err
	}
	r := &BatchResult{Spec: s}
	for _, name := range []string{BatchRunLane, BatchRunSync, BatchRunInteractiveOnly} {
		run := jobs
		if name == BatchRunInteractiveOnly {
			run = jobs[:s.Interactive]
		}
		br, err := runBatchOnce(ctx, s, name, run, opt)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		r.Runs = append(r.Runs, br)
	}
	r.judge()
	r.WallS = time.Since(began).Seconds()
	return r, nil
}

// judge fills r's ratios and verdict from its three runs.
func (r *BatchResult) judge() {
	lane, syn, alone := r.Runs[0], r.Runs[1], r.Runs[2]
	r.BatchWorkLane, r.BatchWorkSync = lane.Cost-alone.Cost, syn.Cost-alone.Cost
	if r.BatchWorkSync > 0 {
		r.CostRatio = r.BatchWorkLane / r.BatchWorkSync
	}
	if syn.Cost > 0 {
		r.TotalRatio = lane.Cost / syn.Cost
	}
	tg := BatchTarget
	var why []string
	if r.BatchWorkSync <= 0 || r.CostRatio > tg.MaxCostRatio {
		why = append(why, fmt.Sprintf("batch work cost %.3fx the all-sync run's > %.2fx", r.CostRatio, tg.MaxCostRatio))
	}
	for _, run := range r.Runs {
		if run.Failed > 0 || run.Unfinished > 0 || run.Missed > 0 {
			if run.Name == BatchRunLane || run.Name == BatchRunInteractiveOnly {
				why = append(why, fmt.Sprintf("%s: %d failed, %d unfinished, %d deadlines missed", run.Name, run.Failed, run.Unfinished, run.Missed))
			}
		}
	}
	if limit := waitLimit(alone.WaitP95MS); lane.WaitP95MS > limit {
		why = append(why, fmt.Sprintf("interactive p95 queue wait %.0f ms > %.0f ms (interactive-only %.0f ms + slack)", lane.WaitP95MS, limit, alone.WaitP95MS))
	}
	r.Pass, r.Why = len(why) == 0, strings.Join(why, "; ")
}

// waitLimit is the interactive p95 queue wait the lane run may reach
// given the interactive-only run's.
func waitLimit(aloneMS float64) float64 {
	return max(aloneMS*(1+BatchTarget.WaitSlack), aloneMS+BatchTarget.WaitSlackMS)
}

// outputCounter is the simulator's Config.OutputTokens: OutputShare of
// max_tokens, every completion token it hands out counted (synchronous
// calls and batch lines alike).
type outputCounter struct {
	share float64
	n     atomic.Int64
}

func (c *outputCounter) tokens(maxTokens int, _ []byte) int {
	n := max(int(float64(maxTokens)*c.share), 1)
	c.n.Add(int64(n))
	return n
}

// bill is the provider's bill from the simulator's ledgers: its
// synchronous completions (SuccessTokens, of which out - the batch lines'
// output were completion tokens) at list price, and its succeeded batch
// lines at the batch factor.
func (s BatchSpec) bill(st sim.ModelStats, lines []sim.BatchLine, out int64) (cost float64, byResult map[string]int) {
	byResult = map[string]int{}
	var bin, bout int64
	for _, l := range lines {
		byResult[l.Result]++
		bin, bout = bin+int64(l.InputTokens), bout+int64(l.OutputTokens)
	}
	syncOut := out - bout
	syncIn := st.SuccessTokens - syncOut
	list := func(in, out int64) float64 { return (float64(in)*s.InputPrice + float64(out)*s.OutputPrice) / 1e6 }
	return list(syncIn, syncOut) + s.BatchFactor*list(bin, bout), byResult
}

// providerYAML is the configuration's providers list for one run.
func (s BatchSpec) providerYAML(url string, lane bool, conc int) string {
	return fmt.Sprintf(`  - name: sim
    base_url: %s/v1
    models:
      - name: %s
        rpm: %d
        tpm: %d
        max_concurrency: %d
        price: {input_per_mtok: %g, output_per_mtok: %g, batch_factor: %g}
        batch: {enabled: %t, collect: %s, poll: %s, min_deadline: %s, rescue: %s}
`, url, Model, s.RPM, s.TPM, conc, s.InputPrice, s.OutputPrice, s.BatchFactor, lane, s.Collect, s.Poll, s.MinDeadline, s.Rescue)
}

// runBatchOnce runs jobs against a fresh simulator and node, the lane
// enabled in the lane run only.
func runBatchOnce(ctx context.Context, s BatchSpec, name string, jobs []batchJob, opt Options) (*BatchRun, error) {
	began := time.Now()
	out := &outputCounter{share: s.OutputShare}
	sm, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: Model, RPM: s.RPM, TPM: s.TPM}}, TTFT: opt.TTFT, PerToken: opt.PerToken,
		OutputTokens: out.tokens, Batch: sim.BatchConfig{Duration: s.SimBatch}})
	if err != nil {
		return nil, err
	}
	url, stop, err := serve(sm)
	if err != nil {
		return nil, err
	}
	defer stop()
	waits := newWaitLog()
	n, err := startNode(ctx, nodeSpec{providers: s.providerYAML(url, name == BatchRunLane, opt.Concurrency), retry: opt.Retry,
		maxElapsed: opt.RunTimeout, log: slog.New(waits.handler(opt.Log.Handler())), nats: natsOpen})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := n.stop(); err != nil {
			opt.Log.Warn("close sluice", "err", err)
		}
	}()
	results, err := offerBatchJobs(ctx, n, jobs, opt)
	if err != nil {
		return nil, err
	}
	var ended []string
	for _, o := range results {
		if o.res != nil {
			ended = append(ended, o.id)
		}
	}
	logCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	waits.await(logCtx, ended)
	cancel()
	st := sm.Stats()
	r := &BatchRun{Name: name, Jobs: len(jobs), SyncCalls: st.Completed, Refused: st.Models[Model].RateLimited}
	r.Cost, r.BatchLines = s.bill(st.Models[Model], sm.BatchLines(), out.n.Load())
	r.tally(jobs, results, waits)
	r.WallS = time.Since(began).Seconds()
	return r, nil
}

// offered is one job's submission and result.
type offered struct {
	id     string
	sentAt time.Time
	res    *job.Result
}

// offerBatchJobs hands jobs to n on their schedule and collects their
// results until all have one or opt.RunTimeout passes.
func offerBatchJobs(ctx context.Context, n *meshNode, jobs []batchJob, opt Options) ([]offered, error) {
	t0 := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, t0.Add(opt.RunTimeout))
	defer cancel()
	out := make([]offered, len(jobs))
	index := make(map[string]int, len(jobs))
	for i := range jobs {
		out[i].id = job.NewID()
		index[out[i].id] = i
	}
	var mu sync.Mutex
	left := len(jobs)
	done := make(chan struct{})
	sub, err := n.cl.Subscribe(tenant, func(r *job.Result) {
		mu.Lock()
		defer mu.Unlock()
		if i, ok := index[r.JobID]; ok && out[i].res == nil {
			out[i].res = r
			if left--; left == 0 {
				close(done)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	var wg sync.WaitGroup
	next := make(chan int)
	for range submitters {
		wg.Go(func() {
			for i := range next {
				sent := time.Now()
				dl := sent.Add(jobs[i].deadline)
				j := &job.Job{ID: out[i].id, Tenant: tenant, Priority: jobs[i].priority, Deadline: &dl, Request: jobs[i].Body}
				mu.Lock()
				out[i].sentAt = sent
				mu.Unlock()
				if err := n.submit(runCtx, j); err != nil && runCtx.Err() == nil {
					opt.Log.Warn("submit", "err", err)
				}
			}
		})
	}
	// The batch jobs (at once) first, then the interactive ones on time.
	var order []int
	for _, first := range []bool{true, false} {
		for i, j := range jobs {
			if (j.priority == job.Batch) == first {
				order = append(order, i)
			}
		}
	}
feed:
	for _, i := range order {
		if !sleep(runCtx, time.Until(t0.Add(jobs[i].at))) {
			break
		}
		select {
		case next <- i:
		case <-runCtx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	select {
	case <-done:
	case <-runCtx.Done():
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	return append([]offered(nil), out...), nil
}

// tally fills r's job counts, costs and interactive queue waits.
func (r *BatchRun) tally(jobs []batchJob, results []offered, waits *waitLog) {
	var ws []time.Duration
	for i, o := range results {
		res := o.res
		if res == nil {
			r.Unfinished++
			r.Missed++
			continue
		}
		if res.Status != job.StatusSucceeded {
			r.Failed++
		} else {
			r.Succeeded++
		}
		if res.Status != job.StatusSucceeded || res.CompletedAt.After(o.sentAt.Add(jobs[i].deadline)) {
			r.Missed++
		}
		if res.Lane == job.LaneBatch {
			r.LaneJobs++
		}
		if res.Cost != nil {
			r.SluiceCost += *res.Cost
			if jobs[i].priority == job.Batch {
				r.BatchWorkCost += *res.Cost
			}
		}
		if jobs[i].priority == job.Interactive {
			if d, ok := waits.wait(o.id); ok {
				ws = append(ws, d)
			}
		}
	}
	r.WaitsLogged = len(ws)
	r.WaitP50MS, r.WaitP95MS = ms64(percentile(ws, 0.50)), ms64(percentile(ws, 0.95))
}

// WriteBatch prints r.
func WriteBatch(w io.Writer, r *BatchResult) {
	s := r.Spec
	fmt.Fprintf(w, "batch: %s at RPM %d, TPM %d, price %g/%g per Mtok, batch factor %g; %d interactive jobs over %s (deadline %s), %d batch jobs at once (deadline %s); %d prompt + %d max tokens each\n",
		Model, s.RPM, s.TPM, s.InputPrice, s.OutputPrice, s.BatchFactor, s.Interactive, s.OfferFor, s.InteractiveDeadline, s.Batch, s.BatchDeadline, s.PromptTokens, s.MaxTokens)
	fmt.Fprintf(w, "  lane: collect %s, poll %s, min_deadline %s, rescue %s; the simulator takes %s per batch\n", s.Collect, s.Poll, s.MinDeadline, s.Rescue, s.SimBatch)
	fmt.Fprintf(w, "  %-16s %5s %5s %5s %6s %6s %6s %6s %11s %11s %8s %8s %7s\n",
		"run", "jobs", "succ", "fail", "missed", "sync", "429s", "lines", "bill", "sluice cost", "wait p50", "wait p95", "wall")
	for _, run := range r.Runs {
		fmt.Fprintf(w, "  %-16s %5d %5d %5d %6d %6d %6d %6d %11.6f %11.6f %6.0fms %6.0fms %6.1fs\n",
			run.Name, run.Jobs, run.Succeeded, run.Failed+run.Unfinished, run.Missed, run.SyncCalls, run.Refused,
			run.BatchLines["succeeded"], run.Cost, run.SluiceCost, run.WaitP50MS, run.WaitP95MS, run.WallS)
	}
	fmt.Fprintf(w, "  batch work: %.6f through the lane vs %.6f all-sync = %.3fx (the whole bill %.3fx; half the work interactive, it cannot go below 0.75x)\n",
		r.BatchWorkLane, r.BatchWorkSync, r.CostRatio, r.TotalRatio)
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL (" + r.Why + ")"
	}
	fmt.Fprintf(w, "  target batch work ≤%.2fx its all-sync cost, every deadline met, interactive p95 wait ≤ interactive-only's +%.0f%% or +%.0f ms: %s; %.1fs\n",
		BatchTarget.MaxCostRatio, 100*BatchTarget.WaitSlack, BatchTarget.WaitSlackMS, verdict, r.WallS)
}
