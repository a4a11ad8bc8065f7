package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// steady is a simulator's statistics after secs seconds of perMinute
// successes a minute (evenly spread), at limit rpm.
func steady(rpm int, perMinute float64, secs int) sim.ModelStats {
	ms := sim.ModelStats{RPM: rpm}
	acc := 0.0
	for range secs {
		acc += perMinute / 60
		n := int64(acc)
		acc -= float64(n)
		ms.Timeline = append(ms.Timeline, sim.Second{Admitted: n, Successes: n})
		ms.Admitted += n
	}
	return ms
}

func TestDeploymentsJudge(t *testing.T) {
	t.Parallel()
	tiers, _ := LookupDeploymentScenario("tiers")
	tiers.OfferFor = 120 * time.Second
	deployments, _ := LookupDeploymentScenario("deployments")
	deployments.OfferFor = 120 * time.Second
	for _, tc := range []struct {
		name  string
		sc    DeploymentScenario
		rates []float64 // successes a minute of ptu, east, west
		miss  string    // "" = pass
	}{
		{"tier 0 full, overflow on tier 1", tiers, []float64{120, 16, 8}, ""},
		{"tier 0 underfilled", tiers, []float64{90, 36, 18}, "tier 0 fill"},
		{"every deployment full", deployments, []float64{120, 120, 60}, ""},
		{"west underfilled", deployments, []float64{120, 120, 40}, "west fill"},
	} {
		r := &DeploymentsResult{Scenario: tc.sc}
		var stats []sim.ModelStats
		for i, d := range tc.sc.Group {
			stats = append(stats, steady(d.RPM, tc.rates[i], 130))
		}
		r.judge(stats)
		if r.Pass != (tc.miss == "") || !strings.Contains(r.Why, tc.miss) {
			t.Errorf("%s: pass %v (%s), want a miss naming %q", tc.name, r.Pass, r.Why, tc.miss)
		}
		if r.Windows < 31 || r.Windows > 39 {
			t.Errorf("%s: %d windows, want those ending from the 90th second to the end of the offer or backlog (31-39)", tc.name, r.Windows)
		}
	}
}
