package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/bench"
)

// runBenchAnthropic runs the anthropic-cache scenario (sluice bench
// anthropic-cache, or --scenario anthropic-cache).
func runBenchAnthropic(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench anthropic-cache", stderr)
	spec := bench.DefaultAnthropicCache
	fs.IntVar(&spec.Jobs, "jobs", spec.Jobs, "jobs, submitted at once")
	fs.IntVar(&spec.ITPM, "itpm", spec.ITPM, "the model's input tokens per minute")
	fs.IntVar(&spec.OTPM, "otpm", spec.OTPM, "the model's output tokens per minute")
	fs.IntVar(&spec.RPM, "rpm", spec.RPM, "the model's requests per minute")
	counts := fs.String("count", "1.12,0.85", "the provider's count of a prompt over Sluice's estimate: one run each, comma-separated (above 1: it counts more)")
	seed := fs.Uint64("seed", 1, "seed of the jobs' text")
	conc := fs.Int("concurrency", 32, "Sluice's max_concurrency for the model")
	runTimeout := fs.Duration("run-timeout", 8*time.Minute, "deadline of the run; jobs unfinished by then count as failed")
	ttft := fs.Duration("ttft", 200*time.Millisecond, "simulated latency before the first token")
	perToken := fs.Duration("per-token", 2*time.Millisecond, "simulated latency per output token")
	jsonPath := fs.String("json", "", "write the figures here as JSON")
	verbose := fs.Bool("v", false, "the fleet's logs (info) on stderr")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if spec.Jobs < 1 || spec.ITPM < 1 || spec.OTPM < 0 || spec.RPM < 0 || *conc < 1 || *runTimeout <= 0 {
		return errors.New("want --jobs >= 1, --itpm >= 1, --otpm and --rpm >= 0, --concurrency >= 1 and --run-timeout > 0")
	}
	var factors []float64
	for _, f := range strings.Split(*counts, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0 && v <= 5) {
			return fmt.Errorf("--count %q: want numbers in (0, 5], comma-separated", *counts)
		}
		factors = append(factors, v)
	}
	fmt.Fprintf(stdout, "sluice bench anthropic-cache: %s against the simulator's anthropic profile, Sluice told the real limits\n", bench.FleetDescription())
	opt := bench.Options{Concurrency: *conc, Seed: *seed, RunTimeout: *runTimeout, TTFT: *ttft, PerToken: *perToken}
	if *verbose {
		opt.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	var results []*bench.AnthropicCacheResult
	for _, f := range factors {
		spec.Count = f
		r, err := bench.RunAnthropicCache(ctx, spec, opt)
		if err != nil {
			return err
		}
		bench.WriteAnthropicCache(stdout, r)
		results = append(results, r)
	}
	if *jsonPath != "" {
		if err := benchWriteJSON(*jsonPath, results); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	return nil
}
