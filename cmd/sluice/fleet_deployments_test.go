package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// BenchmarkFleetDeploymentGroup runs the fleet of BenchmarkFleetSharesOneBudget
// (a front, 2 admission and 4 executor processes on one NATS server) in
// front of one model served by three deployments, each its own simulator:
// ptu (tier 0, 120 RPM), east (tier 1, 120 RPM) and west (tier 1, 60 RPM,
// called by another upstream name). Short jobs are offered at twice the
// sum for 75 s, and one executor is killed with SIGKILL mid-run. While
// backlogged after the first minute, the group's successful calls must
// fill at least 95 % of the sum of the three limits, no simulator may see
// a 60-s window above its limit, and every job must end exactly once.
//
// A benchmark, not a test (the fill is a figure of time; one run takes
// about 3 minutes):
//
//	go test -run '^$' -bench FleetDeploymentGroup -benchtime 1x ./cmd/sluice/
func BenchmarkFleetDeploymentGroup(b *testing.B) {
	for range b.N {
		fill, windows, rate429 := fleetGroupRun(b)
		b.ReportMetric(100*fill, "fill%-sum")
		b.ReportMetric(100*rate429, "429%")
		if windows < 5 {
			b.Errorf("only %d backlogged windows after the first minute; the run did not bind long enough", windows)
		} else if fill < 0.95 {
			b.Errorf("steady fill of the sum %.1f %%, want at least 95 %%", 100*fill)
		}
	}
}

// fleetGroupRun runs the fleet once in front of the group; it fails t on a
// broken guarantee and returns the steady fill of the sum, over how many
// windows, and the share of attempts answered 429.
func fleetGroupRun(t testing.TB) (fill float64, windows int, rate429 float64) {
	bin := sluiceBinary(t)
	const (
		model    = "gpt-4o-mini"
		offerFor = 75 * time.Second
	)
	group := []struct {
		name, upstream string
		tier, rpm      int
	}{{"ptu", "", 0, 120}, {"east", "", 1, 120}, {"west", "gpt-4o-mini-2024-07-18", 1, 60}}
	sims := make([]*sim.Server, len(group))
	providers := ""
	sum := 0
	for i, d := range group {
		served, upstream := model, ""
		if d.upstream != "" {
			served, upstream = d.upstream, ", upstream: "+d.upstream
		}
		var url string
		sims[i], url = systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: served, RPM: d.rpm, TPM: 50_000_000}},
			TTFT: 100 * time.Millisecond, PerToken: 200 * time.Microsecond, APIKeys: []string{"sim-secret"}})
		providers += fmt.Sprintf(`
  - name: %s
    base_url: %s/v1
    api_key_env: SIM_KEY
    timeout: 20s # a call lost with the killed executor ends outcome_unknown after it
    models:
      - {name: %s, tier: %d, rpm: %d, tpm: 50000000, max_concurrency: 64%s}`, d.name, url, model, d.tier, d.rpm, upstream)
		sum += d.rpm
	}
	cfg := "server: {open: true}\nproviders:" + providers + "\ntenants:\n  - {name: acme}\n"
	f := startFleet(t, bin, cfg)
	results := watchResults(t, f.nc)

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	for _, s := range sims {
		s.Reset()
	}
	body := systest.ChatBody(model, 110, 80)
	done := make(chan struct{})
	go func() {
		defer close(done)
		results.offer(t, ctx, f.cl, body, 2*float64(sum)/60, "acme", offerFor)
	}()
	// Scenario time, not a wait for a signal: the offer is a timed run,
	// and the kill is placed in its middle.
	time.Sleep(45 * time.Second)
	victim := f.executors[0]
	_ = victim.cmd.Process.Signal(syscall.SIGKILL)
	_ = victim.cmd.Wait()
	<-done

	results.exactlyOnce(t, ctx)

	// The group's fill: each simulator's trailing-60-s successes, summed
	// window by window, over the sum of the limits, while the group was
	// backlogged (up to the first deployment's last admitted second).
	var stats []sim.ModelStats
	var attempts, refused int64
	last := -1
	for i, s := range sims {
		st := s.Stats()
		if st.DuplicateCompletions != 0 {
			t.Errorf("%s completed %d operations twice", group[i].name, st.DuplicateCompletions)
		}
		served := model
		if group[i].upstream != "" {
			served = group[i].upstream
		}
		ms := st.Models[served]
		if ms.MaxRequestsIn60s > ms.RPM {
			t.Errorf("%s: %d requests in a 60-s window, over its %d RPM", group[i].name, ms.MaxRequestsIn60s, ms.RPM)
		}
		attempts, refused = attempts+ms.Admitted+ms.RateLimited, refused+ms.RateLimited
		end := -1
		for j, sec := range ms.Timeline {
			if sec.Admitted > 0 {
				end = j
			}
		}
		if last < 0 || end < last {
			last = end
		}
		stats = append(stats, ms)
		t.Logf("%s (tier %d, %d RPM): %d admitted, %d refused 429", group[i].name, group[i].tier, group[i].rpm, ms.Admitted, ms.RateLimited)
	}
	series := make([][]sim.Fill, len(stats))
	for i, ms := range stats {
		series[i] = ms.FillSeries()
	}
	for k := 0; ; k++ {
		var reqs int64
		ok := true
		for _, s := range series {
			if k >= len(s) || s[k].End > last-2 {
				ok = false
				break
			}
			reqs += s[k].Reqs
		}
		if !ok {
			break
		}
		fill += float64(reqs) / float64(sum)
		windows++
	}
	if windows > 0 {
		fill /= float64(windows)
	}
	if attempts > 0 {
		rate429 = float64(refused) / float64(attempts)
	}
	t.Logf("steady fill of the sum (%d RPM) %.1f %% over %d windows; %.2f %% of attempts answered 429", sum, 100*fill, windows, 100*rate429)
	return fill, windows, rate429
}
