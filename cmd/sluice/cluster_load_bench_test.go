package main

import (
	"context"
	"testing"
	"time"
)

// BenchmarkClusterLoad offers 1,000 jobs at 150 a second to the three-node
// cluster (R3, every service on every node) with a provider allowing 200
// calls a second, and checks what the node-loss test checks (every job
// ends once, none paid twice, the limits hold). It reports the provider's
// completions per second from the first submission to the last completion.
// Run it beside a CPU hog to see the budget store under starvation
// (docs/BENCHMARKS.md):
//
//	SLUICE_TEST_LOGS=/tmp/logs go test -run '^$' -bench ClusterLoad -benchtime 1x -timeout 20m ./cmd/sluice/
func BenchmarkClusterLoad(b *testing.B) {
	const jobs, perSecond, rpm = 1000, 150, 12_000
	for range b.N {
		_, load, _ := clusterSetup(b, rpm, nil, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		// Eight submitters, so a submission's round trip does not bound
		// the offered rate.
		const submitters = 8
		start := time.Now()
		errs := make(chan error, submitters)
		for range submitters {
			go func() { errs <- load.offer(ctx, jobs/submitters, float64(perSecond)/submitters) }()
		}
		for range submitters {
			if err := <-errs; err != nil {
				cancel()
				b.Fatal(err)
			}
		}
		offered := time.Since(start)
		waitCompleted(ctx, b, load.sim, jobs)
		took := time.Since(start)
		b.Logf("offered in %v, completed in %v", offered.Round(10*time.Millisecond), took.Round(10*time.Millisecond))
		load.verify(ctx)
		cancel()
		b.ReportMetric(jobs/took.Seconds(), "completed/s")
		b.ReportMetric(perSecond, "offered/s")
	}
}
