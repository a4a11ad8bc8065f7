package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/sluice-dev/sluice/internal/bench"
)

// runBenchBatch runs the batch scenario (sluice bench batch, or --scenario
// batch).
func runBenchBatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench batch", stderr)
	s := bench.DefaultBatch
	fs.IntVar(&s.Interactive, "interactive", s.Interactive, "interactive jobs, arriving evenly over --offer-for")
	fs.IntVar(&s.Batch, "batch", s.Batch, "batch-priority jobs of the same shape, handed over at once")
	fs.DurationVar(&s.OfferFor, "offer-for", s.OfferFor, "how long the interactive jobs arrive")
	fs.IntVar(&s.RPM, "rpm", s.RPM, "the model's requests per minute")
	fs.IntVar(&s.TPM, "tpm", s.TPM, "the model's tokens per minute")
	fs.DurationVar(&s.SimBatch, "sim-batch", s.SimBatch, "how long the simulator takes over one batch")
	fs.DurationVar(&s.BatchDeadline, "batch-deadline", s.BatchDeadline, "the batch jobs' deadline from their submission")
	seed := fs.Uint64("seed", 1, "seed of the jobs' text")
	conc := fs.Int("concurrency", 32, "Sluice's max_concurrency for the model")
	runTimeout := fs.Duration("run-timeout", 5*time.Minute, "deadline of each run; jobs unfinished by then count as failed")
	ttft := fs.Duration("ttft", 200*time.Millisecond, "simulated latency before the first token")
	perToken := fs.Duration("per-token", 2*time.Millisecond, "simulated latency per output token")
	jsonPath := fs.String("json", "", "write the figures here as JSON")
	verbose := fs.Bool("v", false, "the node's logs (info) on stderr")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if s.Interactive < 1 || s.Batch < 1 || s.OfferFor <= 0 || s.RPM < 1 || s.TPM < 1 || s.SimBatch < 0 || *conc < 1 || *runTimeout <= 0 {
		return errors.New("want --interactive, --batch, --rpm, --tpm and --concurrency >= 1, --offer-for and --run-timeout > 0, --sim-batch >= 0")
	}
	if s.BatchDeadline < s.MinDeadline {
		return fmt.Errorf("--batch-deadline %s: at least the lane's min_deadline, %s", s.BatchDeadline, s.MinDeadline)
	}
	fmt.Fprintf(stdout, "sluice bench batch: 1 in-process node (embedded NATS, every service) against the simulator's OpenAI API and Batch API, three runs of the same jobs: the batch lane enabled, disabled (all sync), interactive jobs only\n")
	opt := bench.Options{Concurrency: *conc, Seed: *seed, RunTimeout: *runTimeout, TTFT: *ttft, PerToken: *perToken}
	if *verbose {
		opt.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	r, err := bench.RunBatch(ctx, s, opt)
	if err != nil {
		return err
	}
	bench.WriteBatch(stdout, r)
	if *jsonPath != "" {
		if err := benchWriteJSON(*jsonPath, r); err != nil {
			return fmt.Errorf("--json: %w", err)
		}
	}
	return nil
}
