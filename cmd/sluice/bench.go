package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/sluice-dev/sluice/internal/bench"
)

const benchUsage = `Usage: sluice bench [flags]
       sluice bench overhead [flags]
       sluice bench anthropic-cache [flags]
       sluice bench batch [flags]

sluice bench runs the same workload against the same simulated provider limits
with four strategies at once (retry-only, rpm-limiter, token-shaping, sluice),
each against its own simulator, and reports what each simulator's ledger saw:
a table, an SVG chart of successful usage per trailing 60 s, and optionally JSON.
Sluice runs as a small in-process fleet: one node embedding NATS with every
service, one more admission node and two more executor nodes joining it.

It runs, in one command, the workload comparison (every workload against the
simulator's default profile: a 60-s window plus a 1-s quantum at limit/60, with
rate headers; Sluice told the real limits) and the scenarios, which vary the
provider's profile and what Sluice is told, and judge Sluice against a target:

` + "%s" + `
The direct strategies are always told the real limits. --workload and
--scenario select: naming only one of them runs only what it names, so
"--workload a" runs workload a alone and "--scenario all" the scenarios alone.
A scenario runs its own workload unless named as NAME:WORKLOAD. A full run
takes about 14 minutes; --scale 0.2 --run-timeout 10s makes a quick smoke run.

sluice bench anthropic-cache (also --scenario anthropic-cache) runs agent-like
jobs (a 3,000-token cached system prompt + a 200-token turn, max_tokens 500)
against the simulator's anthropic profile (RPM, ITPM and OTPM buckets, cache
reads free), ITPM-bound, once with the provider counting prompts 12%% above
Sluice's estimate and once 15%% below (--count); target each time: ≥0.95 of
ITPM as the provider counts it, ≤0.5%% 429s, ≥3x the requests per minute
full-prompt reservation allows.

sluice bench batch (also --scenario batch) runs interactive jobs arriving over a
minute and as many batch-priority jobs of the same shape (half the work by
tokens) with a 10-minute deadline, on one priced model bound by its RPM/TPM,
three times against fresh simulators: the batch lane enabled, disabled (all
sync), and the interactive jobs alone; target: the batch work's bill (sync at
list price, batch lines at the batch factor) ≤0.55x its all-sync bill, every
deadline met, interactive p95 queue wait ≤ the interactive-only run's +10%%
or +50 ms. About 4 minutes.

sluice bench --scenario deployments,tiers runs one model served by three
deployments, each its own simulator (120, 120 and 60 RPM in tiers 0, 1, 1),
short jobs arriving steadily: deployments at twice the sum (target: ≥0.95
steady fill of the sum and of each deployment, ≤0.5%% 429s, 0 lost), tiers at
1.2x the tier-0 limit (target: tier 0 ≥0.95 filled, the others carrying no
more than the overflow). They run apart from the other scenarios.

sluice bench overhead measures what the mesh adds between accepting a job and
the provider receiving it, and jobs per second, against a zero-latency
simulator with no limits. It also measures JetStream's own rates on the same
embedded server configuration (synchronous publish, pull and double ack, KV
put), before and after the run, and prints Sluice's throughput as a ratio to
a naive durable pipeline's: 1 / (2/sync_publish + 1/pull_ack) jobs/s.

Flags:
`

// scenarioUsage lists the scenarios for the usage text.
func scenarioUsage() string {
	var b strings.Builder
	for _, sc := range bench.Scenarios {
		fmt.Fprintf(&b, "  %-13s workload %-3s  %s\n                              target: %s\n", sc.Name, sc.Workload, sc.Description, sc.Target)
	}
	return b.String()
}

// benchFile is everything `sluice bench --json` writes.
type benchFile struct {
	Seed        uint64                  `json:"seed"`
	Concurrency int                     `json:"concurrency"`
	RunTimeoutS float64                 `json:"run_timeout_s"`
	TTFTMS      float64                 `json:"ttft_ms"`
	PerTokenMS  float64                 `json:"per_token_ms"`
	Load        float64                 `json:"load"`
	Scale       float64                 `json:"scale"`
	Retry       benchRetry              `json:"retry"`
	SluiceFleet string                  `json:"sluice_fleet"`
	WallS       float64                 `json:"wall_s"`
	Workloads   []*bench.WorkloadResult `json:"workloads"`
	Scenarios   []*bench.WorkloadResult `json:"scenarios"`
	// ScenariosPassed counts the scenarios whose target Sluice met.
	ScenariosPassed int `json:"scenarios_passed"`
}

type benchRetry struct {
	MaxAttempts int     `json:"max_attempts"`
	BaseMS      float64 `json:"base_ms"`
	MaxMS       float64 `json:"max_ms"`
}

// benchRun is one run of the command: a workload, alone or in a scenario.
type benchRun struct {
	scenario *bench.Scenario
	w        *bench.Workload
}

func (r benchRun) label() string {
	if r.scenario == nil {
		return "workload " + r.w.Name
	}
	return "scenario " + r.scenario.Name + ":" + r.w.Name
}

func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "overhead" {
		return runBenchOverhead(ctx, args[1:], stdout, stderr)
	}
	if len(args) == 1 && args[0] == "trace-sink" {
		// The OTLP/HTTP receiver `bench overhead --trace` starts in a
		// process of its own; it ends when its standard input does.
		return bench.ServeSpanSink(os.Stdin, stdout)
	}
	if len(args) > 0 && args[0] == "anthropic-cache" {
		return runBenchAnthropic(ctx, args[1:], stdout, stderr) // bench_anthropic.go
	}
	if len(args) > 0 && args[0] == "batch" {
		return runBenchBatch(ctx, args[1:], stdout, stderr) // bench_batch.go
	}
	if len(args) == 1 && (args[0] == "--scenario=batch" || args[0] == "-scenario=batch") ||
		len(args) == 2 && (args[0] == "--scenario" || args[0] == "-scenario") && args[1] == "batch" {
		return runBenchBatch(ctx, nil, stdout, stderr)
	}
	if len(args) == 1 && (args[0] == "--scenario=anthropic-cache" || args[0] == "-scenario=anthropic-cache") ||
		len(args) == 2 && (args[0] == "--scenario" || args[0] == "-scenario") && args[1] == "anthropic-cache" {
		return runBenchAnthropic(ctx, nil, stdout, stderr)
	}
	if _, only, err := deploymentScenarios(args); err != nil {
		return err
	} else if only {
		return runBenchDeployments(ctx, args, stdout, stderr) // bench_deployments.go
	}
	fs := newFlagSet("bench", stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), benchUsage, scenarioUsage())
		fs.PrintDefaults()
	}
	workload := fs.String("workload", "all", "workloads of the comparison: "+strings.Join(bench.SpecNames(), ", ")+", all or none")
	scenario := fs.String("scenario", "all", "scenarios: "+strings.Join(bench.ScenarioNames(), ", ")+" (comma-separated, each NAME or NAME:WORKLOAD), all or none")
	conc := fs.Int("concurrency", 32, "workers of the direct strategies (and Sluice's max_concurrency)")
	seed := fs.Uint64("seed", 1, "seed of the workload and of the strategies' jitter")
	runTimeout := fs.Duration("run-timeout", bench.DefaultRunTimeout, "deadline of each strategy's run; jobs unfinished by then count as failed")
	svgPath := fs.String("svg", "bench.svg", "write the chart here (empty: no chart)")
	jsonPath := fs.String("json", "", "write every figure here as JSON")
	quiet := fs.Bool("quiet", false, "no progress bar")
	ttft := fs.Duration("ttft", 200*time.Millisecond, "simulated latency before the first token")
	perToken := fs.Duration("per-token", 2*time.Millisecond, "simulated latency per output token")
	load := fs.Float64("load", 1.25, "offered total as a multiple of one minute of the binding limit (all at once)")
	scale := fs.Float64("scale", 1, "multiply every limit (and so the job counts) by this; small values make quick smoke runs")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["workload"] && !set["scenario"] {
		*scenario = "none"
	}
	if set["scenario"] && !set["workload"] {
		*workload = "none"
	}
	var names []string
	switch *workload {
	case "all":
		names = bench.SpecNames()
	case "none":
	default:
		if _, ok := bench.LookupSpec(*workload); !ok {
			return fmt.Errorf("--workload %q: want %s, all or none", *workload, strings.Join(bench.SpecNames(), ", "))
		}
		names = []string{*workload}
	}
	scenarios, err := bench.ParseScenarios(*scenario)
	if err != nil {
		return fmt.Errorf("--scenario: %w", err)
	}
	if len(names) == 0 && len(scenarios) == 0 {
		return errors.New("nothing to run: --workload none and --scenario none")
	}
	if *conc < 1 || *runTimeout <= 0 || *load <= 0 || *load > 10 || *scale <= 0 || *ttft < 0 || *perToken < 0 {
		return errors.New("want --concurrency >= 1, --run-timeout > 0, 0 < --load <= 10, --scale > 0 and latencies >= 0")
	}

	var runs []benchRun
	total := 0
	generate := func(name string) (*bench.Workload, error) {
		spec, _ := bench.LookupSpec(name)
		return bench.Generate(spec, *load, *scale, *seed)
	}
	for _, name := range names {
		w, err := generate(name)
		if err != nil {
			return err
		}
		runs = append(runs, benchRun{w: w})
		total += len(w.Jobs) * len(bench.Strategies)
	}
	for i := range scenarios {
		spec, _ := bench.LookupSpec(scenarios[i].Workload)
		w, err := bench.Generate(spec, scenarios[i].LoadFor(*load), *scale, *seed)
		if err != nil {
			return err
		}
		runs = append(runs, benchRun{scenario: &scenarios[i], w: w})
		total += len(w.Jobs) * len(bench.Strategies)
	}
	fmt.Fprintf(stdout, "sluice bench: %s on %d simulators at once per run (one each), latency %s + %s/output token, seed %d\n",
		strings.Join(bench.Strategies, ", "), len(bench.Strategies), *ttft, *perToken, *seed)
	r := bench.DefaultRetry
	fmt.Fprintf(stdout, "direct strategies: %d workers; retry on 429/5xx up to %d attempts, full-jitter backoff %s base, %s cap, Retry-After as floor; run deadline %s\n",
		*conc, r.MaxAttempts, r.Base, r.Max, *runTimeout)
	fmt.Fprintf(stdout, "sluice: %s\n", bench.FleetDescription())
	described := map[string]bool{}
	for _, run := range runs {
		if !described[run.w.Name] {
			described[run.w.Name] = true
			bench.Describe(stdout, run.w)
		}
	}
	for _, run := range runs {
		if sc := run.scenario; sc != nil {
			fmt.Fprintf(stdout, "scenario %-12s on %-3s %s; target %s\n", sc.Name, run.w.Name, sc.Setup.Describe(), sc.Target)
		}
	}
	fmt.Fprintln(stdout)

	var bar *progressbar.ProgressBar
	onJob := func() {}
	if !*quiet {
		bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(stderr), progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(), progressbar.OptionSetPredictTime(false), progressbar.OptionSetElapsedTime(true),
			progressbar.OptionThrottle(250*time.Millisecond), progressbar.OptionSetDescription("jobs finished"))
		onJob = func() { _ = bar.Add(1) }
	}
	began := time.Now()
	opt := bench.Options{Concurrency: *conc, Seed: *seed, RunTimeout: *runTimeout, TTFT: *ttft, PerToken: *perToken, OnJob: onJob}
	var workloads, scenarioResults []*bench.WorkloadResult
	for _, run := range runs {
		if bar != nil {
			bar.Describe(run.label() + ": jobs finished")
		}
		var res *bench.WorkloadResult
		var err error
		if run.scenario == nil {
			res, err = bench.Run(ctx, run.w, opt)
		} else {
			res, err = bench.RunScenario(ctx, *run.scenario, run.w, opt)
		}
		if err != nil {
			if bar != nil {
				_ = bar.Exit()
				fmt.Fprintln(stderr)
			}
			return fmt.Errorf("%s: %w", run.label(), err)
		}
		if run.scenario == nil {
			workloads = append(workloads, res)
		} else {
			scenarioResults = append(scenarioResults, res)
		}
		if bar != nil {
			_ = bar.Clear()
		}
		fmt.Fprintf(stdout, "%s finished in %.1fs\n", run.label(), res.WallS)
	}
	if bar != nil {
		_ = bar.Exit()
		fmt.Fprintln(stderr)
	}
	wall := time.Since(began)
	fmt.Fprintln(stdout)
	results := append(slices.Clone(workloads), scenarioResults...)
	if err := bench.WriteTable(stdout, results); err != nil {
		return err
	}
	passed := 0
	for _, sr := range scenarioResults {
		for _, res := range sr.Results {
			if res.Verdict != nil && res.Verdict.Pass {
				passed++
			}
		}
	}
	if len(scenarioResults) > 0 {
		fmt.Fprintf(stdout, "\nsluice met %d of %d scenario targets\n", passed, len(scenarioResults))
	}
	fmt.Fprintf(stdout, "\ntotal wall time %.1fs\n", wall.Seconds())

	if *svgPath != "" {
		var panels []bench.Panel
		for _, w := range results {
			panels = append(panels, bench.PanelOf(w))
		}
		if err := benchWriteFile(*svgPath, func(w io.Writer) error { return bench.WriteSVG(w, panels) }); err != nil {
			return fmt.Errorf("--svg: %w", err)
		}
		fmt.Fprintf(stdout, "chart written to %s\n", *svgPath)
	}
	if *jsonPath != "" {
		doc := benchFile{Seed: *seed, Concurrency: *conc, RunTimeoutS: runTimeout.Seconds(),
			TTFTMS: float64(*ttft) / 1e6, PerTokenMS: float64(*perToken) / 1e6, Load: *load, Scale: *scale,
			Retry:       benchRetry{MaxAttempts: r.MaxAttempts, BaseMS: float64(r.Base) / 1e6, MaxMS: float64(r.Max) / 1e6},
			SluiceFleet: bench.FleetDescription(), WallS: wall.Seconds(), Workloads: workloads, Scenarios: scenarioResults,
			ScenariosPassed: passed}
		if err := benchWriteJSON(*jsonPath, doc); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
		fmt.Fprintf(stdout, "figures written to %s\n", *jsonPath)
	}
	return nil
}

func runBenchOverhead(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench overhead", stderr)
	jobs := fs.Int("jobs", 5000, "jobs in the loaded test")
	conc := fs.Int("concurrency", 64, "concurrent submitters in the loaded test")
	serial := fs.Int("serial", 300, "jobs in the one-at-a-time test")
	warmup := fs.Int("warmup", 20, "one-at-a-time jobs run first and not counted")
	closed := fs.Bool("closed", false, "each submitter awaits its job's result before submitting the next (default: submit without waiting)")
	secure := fs.Bool("auth-tls", false, "run NATS with authentication (service nkeys, the submitters as the tenant's user) and TLS (default: neither)")
	jsOps := fs.Int("jetstream-ops", 2000, "operations of each kind measuring JetStream's own rates (without authentication or TLS), before and after the run, for the naive pipeline ceiling; 0 skips it")
	floor := fs.Bool("floor", true, "after the loaded test, run the same jobs through the floor pipelines: Sluice's JetStream operations and provider call with nothing else (one node, no authentication or TLS; not with --cluster or --auth-tls)")
	cluster := fs.Int("cluster", 1, "run a JetStream cluster of this many in-process nodes on loopback (R=this many; each node every service); 1: one node")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run (runtime/pprof) to this file")
	memProfile := fs.String("memprofile", "", "write an allocation profile of the run (runtime/pprof, a sample per 16 KiB allocated) to this file")
	jsonPath := fs.String("json", "", "write the figures here as JSON")
	trace := fs.Bool("trace", false, "run the node with tracing on: every trace sampled, exported over OTLP/HTTP to a receiver the benchmark starts on loopback in a process of its own (sluice bench trace-sink), as a collector would run")
	prompt := fs.Int("prompt-bytes", 0, "pad each job's message to about this many bytes (a large prompt); the floor is then not run. 0: a 110-byte body")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if *jobs < 1 || *conc < 1 || *serial < 0 || *warmup < 0 || *jsOps < 0 || *timeout <= 0 || *prompt < 0 {
		return errors.New("want --jobs >= 1, --concurrency >= 1, --serial >= 0, --warmup >= 0, --jetstream-ops >= 0 and --timeout > 0")
	}
	jetStreamOps := *jsOps
	if jetStreamOps == 0 {
		jetStreamOps = -1 // skip (0 means the default to bench.Overhead)
	}
	if *cluster < 1 || *cluster > 5 || (*cluster > 1 && *secure) {
		return errors.New("want --cluster from 1 to 5, and --cluster 1 with --auth-tls")
	}
	if *cluster > 1 {
		fmt.Fprintf(stdout, "sluice bench overhead: a %d-node JetStream cluster in-process on loopback (R%d, each node embedded NATS and every service), zero-latency simulator, no limits\n", *cluster, *cluster)
	} else {
		fmt.Fprintf(stdout, "sluice bench overhead: one in-process node (embedded NATS, every service), zero-latency simulator, no limits\n")
	}
	fmt.Fprintf(stdout, "added latency = the provider receiving the call (X-Sluice-Job-Id) - the moment before client.Submit\n")
	stopProfile := func() error { return nil }
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		stopProfile = func() error {
			pprof.StopCPUProfile()
			return f.Close()
		}
	}
	if *memProfile != "" {
		runtime.MemProfileRate = 16 << 10 // a sample per 16 KiB allocated (the default: 512 KiB)
	}
	floorJobs := 0 // the loaded test's
	if !*floor {
		floorJobs = -1
	}
	var sink []string
	if *trace {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("--trace: %w", err)
		}
		sink = []string{exe, "bench", "trace-sink"}
	}
	began := time.Now()
	rep, err := bench.Overhead(ctx, bench.OverheadOptions{Jobs: *jobs, Concurrency: *conc, Serial: *serial, Warmup: *warmup,
		Closed: *closed, Secure: *secure, JetStreamOps: jetStreamOps, Timeout: *timeout, Cluster: *cluster, FloorJobs: floorJobs, Trace: *trace, SinkCommand: sink,
		PromptBytes: *prompt}, nil)
	if perr := stopProfile(); perr != nil && err == nil {
		err = fmt.Errorf("--cpuprofile: %w", perr)
	}
	if rep != nil {
		bench.WriteOverhead(stdout, rep)
		fmt.Fprintf(stdout, "total wall time %.1fs\n", time.Since(began).Seconds())
	}
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		fmt.Fprintf(stdout, "CPU profile written to %s (go tool pprof -top %s)\n", *cpuProfile, *cpuProfile)
	}
	if *memProfile != "" {
		if err := benchWriteFile(*memProfile, func(w io.Writer) error { return pprof.Lookup("allocs").WriteTo(w, 0) }); err != nil {
			return fmt.Errorf("--memprofile: %w", err)
		}
		fmt.Fprintf(stdout, "allocation profile written to %s (go tool pprof -sample_index=alloc_space -top %s)\n", *memProfile, *memProfile)
	}
	if *jsonPath != "" {
		if err := benchWriteJSON(*jsonPath, rep); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
		fmt.Fprintf(stdout, "figures written to %s\n", *jsonPath)
	}
	return nil
}

func benchWriteJSON(path string, v any) error {
	return benchWriteFile(path, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	})
}

// benchWriteFile writes path through fn, reporting close errors too.
func benchWriteFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
