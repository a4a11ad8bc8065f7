package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/bench"
	"github.com/sluice-dev/sluice/internal/systest"
)

// TestBenchScenarioSmoke runs one scenario alone (naming --scenario only
// skips the workload comparison) with small limits and a deadline of a few
// seconds: the table has its four rows with the target on Sluice's, and the
// JSON has the scenario with Sluice's verdict and fleet metrics.
func TestBenchScenarioSmoke(t *testing.T) {
	systest.SkipShort(t)
	t.Parallel()
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "bench.json")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	args := []string{"--scenario", "hidden", "--scale", "0.2", "--run-timeout", "3s", "--quiet", "--svg", "", "--json", jsonPath}
	if err := runBench(ctx, args, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "hidden:a ") {
			rows++
			if strings.Contains(line, " sluice ") != strings.Contains(line, "≥85% fill, ≤3% 429s: ") {
				t.Errorf("target on the wrong row: %q", line)
			}
		}
	}
	if rows != 4 {
		t.Errorf("table has %d rows for hidden:a, want 4:\n%s", rows, out)
	}
	if !strings.Contains(out, "sluice met ") {
		t.Errorf("no scenario summary:\n%s", out)
	}

	var doc struct {
		Workloads []bench.WorkloadResult `json:"workloads"`
		Scenarios []bench.WorkloadResult `json:"scenarios"`
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("--json output: %v", err)
	}
	if len(doc.Workloads) != 0 || len(doc.Scenarios) != 1 {
		t.Fatalf("--json has %d workloads and %d scenarios, want 0 and 1", len(doc.Workloads), len(doc.Scenarios))
	}
	sc := doc.Scenarios[0]
	if sc.Scenario != "hidden" || sc.Profile != "hidden" || !sc.NoRateHeaders || sc.SluiceRPM != 2*sc.RPM || sc.Target == nil {
		t.Errorf("scenario %q: profile %q, no headers %v, sluice %d RPM against %d, target %v", sc.Scenario, sc.Profile, sc.NoRateHeaders,
			sc.SluiceRPM, sc.RPM, sc.Target)
	}
	for _, r := range sc.Results {
		if (r.Strategy == bench.Sluice) != (r.Verdict != nil) {
			t.Errorf("%s: verdict %v", r.Strategy, r.Verdict)
		}
		if r.Strategy == bench.Sluice && (r.Sluice == nil || r.Sluice.Nodes != len(bench.Fleet)+1 || r.Sluice.Effective == nil) {
			t.Errorf("sluice metrics %+v", r.Sluice)
		}
	}
}

func TestBenchScenarioFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--scenario", "nope"},
		{"--scenario", "known:z"},
		{"--workload", "none"},
		{"--workload", "none", "--scenario", "none"},
		{"--scenario", "known,deployments"}, // the deployment scenarios run apart
		{"--scenario=tiers", "--offer-for", "-1s"},
		{"batch", "--interactive", "0"},
		{"batch", "--batch-deadline", "1m"}, // nearer than the lane's min_deadline
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
	if !strings.Contains(stderr.String(), "--scenario deployments,tiers") {
		t.Errorf("-h does not name the deployment scenarios:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "sluice bench batch") {
		t.Errorf("-h does not describe the batch scenario:\n%s", stderr.String())
	}
	for _, sc := range bench.Scenarios {
		if !strings.Contains(stderr.String(), sc.Name) || !strings.Contains(stderr.String(), sc.Target.String()) {
			t.Errorf("-h does not list scenario %s with its target:\n%s", sc.Name, stderr.String())
		}
	}
}
