package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/systest"
)

// BenchmarkClusterLoad offers 1,000 jobs at 150 a second to the three-node
// cluster (R3, every service on every node) with a provider allowing 200
// calls a second, and checks what the node-loss test checks (every job
// ends once, none paid twice, the limits hold). It reports the provider's
// completions per second from the first submission to the last completion,
// with every process writing the model's schedule (direct) and with one
// owner per schedule (owner: admission.schedule_owner, the default). Run it beside a
// CPU hog to see the budget store under starvation (docs/BENCHMARKS.md);
// with SLUICE_BENCH_PPROF=DIR SLUICE_PPROF=1 it also profiles each node:
//
//	SLUICE_TEST_LOGS=/tmp/logs go test -run '^$' -bench ClusterLoad -benchtime 1x -timeout 20m ./cmd/sluice/
func BenchmarkClusterLoad(b *testing.B) {
	b.Run("direct", func(b *testing.B) { benchClusterLoad(b, "admission:\n  schedule_owner: {enabled: false}\n") })
	b.Run("owner", func(b *testing.B) { benchClusterLoad(b, "") })
	b.Run("idle", benchClusterIdle)
}

// benchClusterIdle reports what the same cluster's nodes spend with nothing
// offered: the CPU a job's figure above carries at a low rate.
func benchClusterIdle(b *testing.B) {
	for range b.N {
		c, _, _ := clusterSetupYAML(b, 12_000, nil, nil, "")
		const settle, d = 5 * time.Second, 20 * time.Second
		time.Sleep(settle) // a benchmark's window: the nodes settle after start before CPU is read
		cpu0 := nodesCPU(b, c)
		time.Sleep(d) // the measured window: CPU over d is the figure
		cores := (nodesCPU(b, c) - cpu0) / d.Seconds()
		b.Logf("idle: the three nodes used %.3f cores", cores)
		b.ReportMetric(cores, "idle-cores")
	}
}

func benchClusterLoad(b *testing.B, yamlExtra string) {
	const jobs, perSecond, rpm = 1000, 150, 12_000
	for range b.N {
		c, load, _ := clusterSetupYAML(b, rpm, nil, nil, yamlExtra)
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		// Eight submitters, so a submission's round trip does not bound
		// the offered rate.
		const submitters = 8
		profileNodes(ctx, b, c, 6*time.Second)
		cpu0 := nodesCPU(b, c)
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
		cpu := nodesCPU(b, c) - cpu0
		b.Logf("offered in %v, completed in %v; the nodes used %.1f s of CPU (%.2f ms a job, %.2f cores)",
			offered.Round(10*time.Millisecond), took.Round(10*time.Millisecond), cpu, 1000*cpu/jobs, cpu/took.Seconds())
		load.verify(ctx)
		cancel()
		b.Logf("budget store and lapses, summed over the nodes: %s", budgetCounters(c))
		b.ReportMetric(jobs/took.Seconds(), "completed/s")
		b.ReportMetric(perSecond, "offered/s")
	}
}

// profileNodes, with SLUICE_BENCH_PPROF=DIR in the environment (which the
// nodes inherit, as SLUICE_PPROF), writes each node's CPU profile of the
// next d to DIR/<benchmark>-<node>.pprof.
func profileNodes(ctx context.Context, b *testing.B, c *cluster, d time.Duration) {
	dir := os.Getenv("SLUICE_BENCH_PPROF")
	if dir == "" {
		return
	}
	for _, n := range c.nodes {
		url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", n.proc.MetricsURL(), int(d.Seconds()))
		path := filepath.Join(dir, strings.ReplaceAll(b.Name(), "/", "_")+"-"+n.name+".pprof")
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Logf("profile %s: %v", path, err)
				return
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			if err := os.WriteFile(path, data, 0o600); err != nil {
				b.Logf("profile %s: %v", path, err)
			}
		}()
	}
}

// nodesCPU sums the nodes' process CPU time (user + system) in seconds.
func nodesCPU(b *testing.B, c *cluster) float64 {
	var sum float64
	for _, n := range c.nodes {
		sum += systest.MetricSum(b, n.proc.MetricsURL(), "process_cpu_seconds_total")
	}
	return sum
}

// budgetCounters sums, over the cluster's nodes, the metrics that say how
// the budget store and the send instants fared.
func budgetCounters(c *cluster) string {
	names := []string{"sluice_budget_writes_total", "sluice_budget_conflicts_total", "sluice_budget_errors_total",
		"sluice_reservations_expired_total", "sluice_requeues_total",
		`sluice_budget_owner_writes_total{path="served"`, `sluice_budget_owner_writes_total{path="forwarded"`,
		`sluice_budget_owner_writes_total{path="fallback"`, `sluice_budget_owner_writes_total{path="dropped"`,
		"sluice_consume_restarts_total"}
	sums := map[string]float64{}
	for _, n := range c.nodes {
		resp, err := http.Get(n.proc.MetricsURL() + "/metrics")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if dir := os.Getenv("SLUICE_BENCH_PPROF"); dir != "" {
			_ = os.WriteFile(filepath.Join(dir, n.name+".metrics"), body, 0o600)
		}
		for line := range strings.Lines(string(body)) {
			for _, name := range names {
				if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") || strings.Contains(name, "{") && strings.HasPrefix(line, name) {
					f := strings.Fields(line)
					if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
						sums[name] += v
					}
				}
			}
		}
	}
	var out []string
	for _, name := range names {
		short := strings.TrimPrefix(name, "sluice_")
		if _, path, ok := strings.Cut(name, `{path="`); ok {
			short = "owner_" + strings.TrimSuffix(path, `"`)
		}
		out = append(out, fmt.Sprintf("%s %.0f", short, sums[name]))
	}
	return strings.Join(out, ", ")
}
