package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/bench"
	"github.com/sluice-dev/sluice/internal/systest"
)

// TestBenchSmoke runs the whole comparison on one workload with small
// limits and a deadline of a few seconds: every strategy reports, the files
// are written, and Sluice never drew a 429. How much each strategy finished
// in those seconds is a figure of time (the machine may be busy): logged.
func TestBenchSmoke(t *testing.T) {
	systest.SkipShort(t)
	t.Parallel()
	dir := t.TempDir()
	svgPath, jsonPath := filepath.Join(dir, "bench.svg"), filepath.Join(dir, "bench.json")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	args := []string{"--workload", "a", "--scale", "0.2", "--run-timeout", "4s", "--quiet", "--svg", svgPath, "--json", jsonPath}
	if err := runBench(ctx, args, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	row := regexp.MustCompile(`^\s*a\s+(retry-only|rpm-limiter|token-shaping|sluice)\s+[0-9.]+%\*? of RPM\s`)
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		if row.MatchString(line) {
			rows++
		}
	}
	if rows != 4 {
		t.Errorf("table has %d rows for workload a, want 4:\n%s", rows, out)
	}

	var doc struct {
		Workloads []bench.WorkloadResult `json:"workloads"`
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("--json output: %v", err)
	}
	if len(doc.Workloads) != 1 || len(doc.Workloads[0].Results) != 4 {
		t.Fatalf("--json has %d workloads, want 1 with 4 results", len(doc.Workloads))
	}
	for _, r := range doc.Workloads[0].Results {
		if r.Strategy == bench.Sluice {
			if r.Provider429s != 0 {
				t.Errorf("sluice drew %d provider 429s, want 0", r.Provider429s)
			}
			t.Logf("sluice completed %d jobs in its run", r.Successes)
		}
		if r.MaxRequestsIn60s > doc.Workloads[0].RPM*2 {
			t.Errorf("%s: %d requests in 60 s against %d RPM: not a simulator's ledger", r.Strategy, r.MaxRequestsIn60s, doc.Workloads[0].RPM)
		}
	}

	svg, err := os.ReadFile(svgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(svg, new(struct{})); err != nil {
		t.Errorf("--svg output is not well-formed: %v", err)
	}
	if n := strings.Count(string(svg), "<polyline"); n != 4 {
		t.Errorf("chart has %d polylines, want 4", n)
	}
}

func TestBenchOverhead(t *testing.T) {
	systest.SkipShort(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := runBench(ctx, []string{"overhead", "--jobs", "200", "--serial", "30", "--warmup", "5", "--jetstream-ops", "300"}, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("bench overhead: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, re := range []string{
		`serial \(one job at a time, 30 jobs\): added latency p50 [0-9.]+ms  p99 [0-9.]+ms`,
		`added latency p50 [0-9.]+ms  p90 [0-9.]+ms  p99 [0-9.]+ms`,
		`200 jobs completed \(0 failed\) in [0-9.]+s from first submit to last result = [0-9]+ jobs/s`,
		`sluice / ceiling: [0-9.]+`,
		// The floor pipelines ran the same 200 jobs each.
		`floor \(Sluice's JetStream operations per job and nothing else.*200 jobs, 64 submitters\)`,
		`two records \(as Sluice\), no provider call +[0-9]+ jobs/s  cpu [0-9.]+ ms per job, [0-9.]+ of the ceiling`,
		`two records \(as Sluice\), provider call +[0-9]+ jobs/s`,
		`one record per job, +provider call +[0-9]+ jobs/s`,
		`sluice / floor with the provider call: [0-9.]+`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %q:\n%s", re, out)
		}
	}
}

func TestBenchFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--workload", "c"},
		{"--concurrency", "0"},
		{"--load", "0"},
		{"overhead", "--jobs", "0"},
		{"extra"},
	} {
		var stdout, stderr bytes.Buffer
		if err := runBench(t.Context(), args, func(string) string { return "" }, &stdout, &stderr); err == nil {
			t.Errorf("runBench(%q) = nil, want an error", args)
		}
	}
	var stdout, stderr bytes.Buffer
	if err := runBench(t.Context(), []string{"-h"}, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Errorf("runBench(-h) = %v, want nil", err)
	}
	if !strings.Contains(stderr.String(), "sluice bench overhead") {
		t.Errorf("-h does not describe the overhead command:\n%s", stderr.String())
	}
}
