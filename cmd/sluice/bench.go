package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/sluice-dev/sluice/internal/bench"
)

const benchUsage = `Usage: sluice bench [flags]
       sluice bench overhead [flags]

sluice bench runs the same workload against the same simulated provider limits
with four strategies at once (retry-only, rpm-limiter, token-shaping, sluice),
each against its own simulator, and reports what each simulator's ledger saw:
a table, an SVG chart of successful usage per trailing 60 s, and optionally JSON.

sluice bench overhead measures what the mesh adds between accepting a job and
the provider receiving it, and jobs per second, against a zero-latency
simulator with no limits.

Flags:
`

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
	WallS       float64                 `json:"wall_s"`
	Workloads   []*bench.WorkloadResult `json:"workloads"`
}

type benchRetry struct {
	MaxAttempts int     `json:"max_attempts"`
	BaseMS      float64 `json:"base_ms"`
	MaxMS       float64 `json:"max_ms"`
}

func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "overhead" {
		return runBenchOverhead(ctx, args[1:], stdout, stderr)
	}
	fs := newFlagSet("bench", stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), benchUsage)
		fs.PrintDefaults()
	}
	workload := fs.String("workload", "all", "workload to run: "+strings.Join(bench.SpecNames(), ", ")+" or all")
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
	names := bench.SpecNames()
	if *workload != "all" {
		if _, ok := bench.LookupSpec(*workload); !ok {
			return fmt.Errorf("--workload %q: want %s or all", *workload, strings.Join(names, ", "))
		}
		names = []string{*workload}
	}
	if *conc < 1 || *runTimeout <= 0 || *load <= 0 || *load > 10 || *scale <= 0 || *ttft < 0 || *perToken < 0 {
		return errors.New("want --concurrency >= 1, --run-timeout > 0, 0 < --load <= 10, --scale > 0 and latencies >= 0")
	}

	var workloads []*bench.Workload
	total := 0
	for _, name := range names {
		spec, _ := bench.LookupSpec(name)
		w, err := bench.Generate(spec, *load, *scale, *seed)
		if err != nil {
			return err
		}
		workloads = append(workloads, w)
		total += len(w.Jobs) * len(bench.Strategies)
	}
	fmt.Fprintf(stdout, "sluice bench: %s on %d simulators at once per workload (one each), latency %s + %s/output token, seed %d\n",
		strings.Join(bench.Strategies, ", "), len(bench.Strategies), *ttft, *perToken, *seed)
	r := bench.DefaultRetry
	fmt.Fprintf(stdout, "direct strategies: %d workers; retry on 429/5xx up to %d attempts, full-jitter backoff %s base, %s cap, Retry-After as floor; run deadline %s\n",
		*conc, r.MaxAttempts, r.Base, r.Max, *runTimeout)
	for _, w := range workloads {
		bench.Describe(stdout, w)
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
	var results []*bench.WorkloadResult
	for _, w := range workloads {
		if bar != nil {
			bar.Describe(fmt.Sprintf("workload %s: jobs finished", w.Name))
		}
		res, err := bench.Run(ctx, w, opt)
		if err != nil {
			if bar != nil {
				_ = bar.Exit()
				fmt.Fprintln(stderr)
			}
			return fmt.Errorf("workload %s: %w", w.Name, err)
		}
		results = append(results, res)
		if bar != nil {
			_ = bar.Clear()
		}
		fmt.Fprintf(stdout, "workload %s finished in %.1fs\n", w.Name, res.WallS)
	}
	if bar != nil {
		_ = bar.Exit()
		fmt.Fprintln(stderr)
	}
	wall := time.Since(began)
	fmt.Fprintln(stdout)
	if err := bench.WriteTable(stdout, results); err != nil {
		return err
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
			Retry: benchRetry{MaxAttempts: r.MaxAttempts, BaseMS: float64(r.Base) / 1e6, MaxMS: float64(r.Max) / 1e6},
			WallS: wall.Seconds(), Workloads: results}
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
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run (runtime/pprof) to this file")
	jsonPath := fs.String("json", "", "write the figures here as JSON")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if *jobs < 1 || *conc < 1 || *serial < 0 || *warmup < 0 || *timeout <= 0 {
		return errors.New("want --jobs >= 1, --concurrency >= 1, --serial >= 0, --warmup >= 0 and --timeout > 0")
	}
	fmt.Fprintf(stdout, "sluice bench overhead: one in-process node (embedded NATS, every service), zero-latency simulator, no limits\n")
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
	began := time.Now()
	rep, err := bench.Overhead(ctx, bench.OverheadOptions{Jobs: *jobs, Concurrency: *conc, Serial: *serial, Warmup: *warmup,
		Closed: *closed, Timeout: *timeout}, nil)
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
