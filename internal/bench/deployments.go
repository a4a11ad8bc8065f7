package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// The deployment scenarios: one model name served by three deployments
// (issue 26's example), each its own simulator: ptu (tier 0, 120 RPM),
// east (tier 1, 120 RPM) and west (tier 1, 60 RPM, called by another
// upstream name). Short jobs arrive at a steady rate for OfferFor; Sluice
// runs as Fleet, told the real limits.

// Deployment is one deployment of a scenario's group.
type Deployment struct {
	Provider string `json:"provider"`
	Tier     int    `json:"tier"`
	RPM      int    `json:"rpm"`
	// Upstream is the model name the provider serves ("": Model).
	Upstream string `json:"upstream,omitempty"`
}

// served is the model name d's simulator serves.
func (d Deployment) served() string {
	if d.Upstream != "" {
		return d.Upstream
	}
	return Model
}

// DeploymentGroup is issue 26's example group.
var DeploymentGroup = []Deployment{
	{Provider: "ptu", Tier: 0, RPM: 120},
	{Provider: "east", Tier: 1, RPM: 120},
	{Provider: "west", Tier: 1, RPM: 60, Upstream: "gpt-4o-mini-2024-07-18"},
}

// DeploymentScenario is a deployment scenario: the group, what is offered
// and what Sluice must achieve.
type DeploymentScenario struct {
	Name        string       `json:"name"`
	Description string       `json:"description"`
	Group       []Deployment `json:"group"`
	// PerMinute is the offered rate (jobs per minute), steady for OfferFor.
	PerMinute float64       `json:"per_minute"`
	OfferFor  time.Duration `json:"offer_for"`
	// MinFill bounds from below the steady fill of the sum of the group's
	// RPM and of each deployment's (Each), or only of tier 0's (TierZero).
	MinFill float64 `json:"min_fill"`
	Each    bool    `json:"each,omitempty"`
	// TierZero: tier 0 is filled to MinFill and the other tiers carry no
	// more than the overflow: at most PerMinute - MinFill x tier 0's RPM.
	TierZero  bool    `json:"tier_zero,omitempty"`
	Max429Pct float64 `json:"max_429_pct,omitempty"`
}

// DeploymentScenarios are the scenarios `sluice bench --scenario
// deployments,tiers` runs.
var DeploymentScenarios = []DeploymentScenario{
	{Name: "deployments", Description: "three deployments of one model at 120/120/60 RPM (tiers 0, 1, 1), short jobs offered at twice the sum",
		Group: DeploymentGroup, PerMinute: 2 * 300, OfferFor: 90 * time.Second, MinFill: 0.95, Each: true, Max429Pct: 0.5},
	{Name: "tiers", Description: "the same group, short jobs offered at 1.2x the tier-0 deployment's limit",
		Group: DeploymentGroup, PerMinute: 1.2 * 120, OfferFor: 150 * time.Second, MinFill: 0.95, TierZero: true, Max429Pct: 0.5},
}

// DeploymentScenarioNames lists the names of DeploymentScenarios.
func DeploymentScenarioNames() []string {
	var out []string
	for _, s := range DeploymentScenarios {
		out = append(out, s.Name)
	}
	return out
}

// LookupDeploymentScenario returns the deployment scenario named name.
func LookupDeploymentScenario(name string) (DeploymentScenario, bool) {
	i := slices.IndexFunc(DeploymentScenarios, func(s DeploymentScenario) bool { return s.Name == name })
	if i < 0 {
		return DeploymentScenario{}, false
	}
	return DeploymentScenarios[i], true
}

// Target says what the scenario must achieve, for reports.
func (sc DeploymentScenario) Target() string {
	var parts []string
	if sc.TierZero {
		parts = append(parts, fmt.Sprintf("tier 0 ≥%s filled, the other tiers ≤ the overflow", pct(100*sc.MinFill)))
	} else {
		parts = append(parts, fmt.Sprintf("≥%s steady fill of the sum", pct(100*sc.MinFill)))
		if sc.Each {
			parts[0] += " and of each deployment"
		}
	}
	if sc.Max429Pct > 0 {
		parts = append(parts, fmt.Sprintf("≤%s 429s", pct(sc.Max429Pct)))
	}
	return strings.Join(append(parts, "0 lost"), ", ")
}

// DeploymentFigures is one deployment's share of a run, as its simulator
// saw it over the steady windows.
type DeploymentFigures struct {
	Deployment
	// Fill is the mean of its trailing-60-s successes over its RPM, and
	// PerMinute the mean successes, over the steady windows
	// (steadyWindows).
	Fill      float64 `json:"fill"`
	PerMinute float64 `json:"per_minute"`
	Attempts  int64   `json:"attempts"`
	Refused   int64   `json:"refused_429"`
	Pct429    float64 `json:"pct_429"`
}

// DeploymentsResult is a deployment scenario's outcome.
type DeploymentsResult struct {
	Scenario    DeploymentScenario  `json:"scenario"`
	Jobs        int                 `json:"jobs"`
	Deployments []DeploymentFigures `json:"deployments"`
	// SumFill is the group's successes over the sum of its RPM, Pct429
	// its 429s over its attempts; Windows how many steady windows.
	SumFill   float64 `json:"sum_fill"`
	Pct429    float64 `json:"pct_429"`
	Windows   int     `json:"windows"`
	Succeeded int     `json:"succeeded"`
	Failed    int     `json:"failed"`
	// Unfinished jobs had no result by the run's deadline.
	Unfinished int            `json:"unfinished"`
	WallS      float64        `json:"wall_s"`
	Pass       bool           `json:"pass"`
	Why        string         `json:"why,omitempty"`
	Sluice     *SluiceMetrics `json:"sluice,omitempty"`
}

// RunDeployments runs sc: a simulator per deployment (quantized profile,
// tokens unlimited), Fleet told the real limits, sc.PerMinute short jobs a
// minute for sc.OfferFor, until every job ended or opt.RunTimeout.
func RunDeployments(ctx context.Context, sc DeploymentScenario, opt Options) (*DeploymentsResult, error) {
	opt = opt.withDefaults()
	began := time.Now()
	sims := make([]*sim.Server, len(sc.Group))
	var providers strings.Builder
	for i, d := range sc.Group {
		s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: d.served(), RPM: d.RPM, TPM: 1_000_000_000}}, TTFT: opt.TTFT, PerToken: opt.PerToken})
		if err != nil {
			return nil, err
		}
		url, stop, err := serve(s)
		if err != nil {
			return nil, err
		}
		defer stop()
		sims[i] = s
		upstream := ""
		if d.Upstream != "" {
			upstream = ", upstream: " + d.Upstream
		}
		fmt.Fprintf(&providers, "  - name: %s\n    base_url: %s/v1\n    models:\n      - {name: %s, tier: %d, rpm: %d, tpm: 1000000000, max_concurrency: %d%s}\n",
			d.Provider, url, Model, d.Tier, d.RPM, opt.Concurrency, upstream)
	}
	n := int(sc.PerMinute * sc.OfferFor.Minutes())
	if n < 1 || sc.PerMinute <= 0 {
		return nil, fmt.Errorf("scenario %s offers no jobs", sc.Name)
	}
	w, err := Generate(Spec{Name: sc.Name, RPM: n, TPM: 1_000_000_000}, 1, 1, opt.Seed)
	if err != nil {
		return nil, err
	}
	m := &mesh{spec: nodeSpec{providers: providers.String(), maxConcurrency: opt.Concurrency, retry: opt.Retry, maxElapsed: opt.RunTimeout,
		log: opt.Log, joiners: Fleet}, every: time.Duration(float64(time.Minute) / sc.PerMinute)}
	if err := m.prepare(ctx, ""); err != nil {
		return nil, err
	}
	defer func() {
		if err := m.close(); err != nil {
			opt.Log.Warn("close sluice", "err", err)
		}
	}()
	for _, s := range sims {
		s.Reset()
	}
	t0 := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, t0.Add(opt.RunTimeout))
	defer cancel()
	t := newTracker(len(w.Jobs), t0, opt.OnJob)
	m.run(runCtx, w.Jobs, t)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	_, failed, unfinished := t.summary()
	r := &DeploymentsResult{Scenario: sc, Jobs: len(w.Jobs), Failed: failed - unfinished, Unfinished: unfinished,
		Succeeded: len(w.Jobs) - failed, Sluice: m.metrics}
	var stats []sim.ModelStats
	for i, s := range sims {
		stats = append(stats, s.Stats().Models[sc.Group[i].served()])
	}
	r.judge(stats)
	r.WallS = time.Since(began).Seconds()
	return r, nil
}

// judge fills r's figures from the simulators' statistics (one per
// deployment, in the group's order) and its verdict.
func (r *DeploymentsResult) judge(stats []sim.ModelStats) {
	sc := r.Scenario
	from, to := steadyWindows(stats, sc.OfferFor)
	var sumRPM, attempts, refused int64
	var sumSucc float64
	tier0RPM := 0
	for i, d := range sc.Group {
		ms := stats[i]
		f := DeploymentFigures{Deployment: d, Attempts: ms.Admitted + ms.RateLimited, Refused: ms.RateLimited}
		f.Pct429 = percent(f.Refused, f.Attempts)
		var fill, reqs float64
		n := 0
		for _, w := range ms.FillSeries() {
			if w.End < from || w.End > to {
				continue
			}
			fill, reqs, n = fill+w.RPM, reqs+float64(w.Reqs), n+1
		}
		if n > 0 {
			f.Fill, f.PerMinute = fill/float64(n), reqs/float64(n)
		}
		r.Windows = n
		r.Deployments = append(r.Deployments, f)
		sumRPM += int64(d.RPM)
		sumSucc += f.PerMinute
		attempts, refused = attempts+f.Attempts, refused+f.Refused
		if d.Tier == 0 {
			tier0RPM += d.RPM
		}
	}
	if sumRPM > 0 {
		r.SumFill = sumSucc / float64(sumRPM)
	}
	r.Pct429 = percent(refused, attempts)
	var why []string
	if r.Windows < 10 {
		why = append(why, fmt.Sprintf("only %d steady windows", r.Windows))
	}
	switch {
	case sc.TierZero:
		var zero, others float64
		for _, f := range r.Deployments {
			if f.Tier == 0 {
				zero += f.PerMinute
			} else {
				others += f.PerMinute
			}
		}
		if tier0RPM > 0 && zero/float64(tier0RPM) < sc.MinFill {
			why = append(why, fmt.Sprintf("tier 0 fill %.3f", zero/float64(tier0RPM)))
		}
		if overflow := sc.PerMinute - sc.MinFill*float64(tier0RPM); others > overflow {
			why = append(why, fmt.Sprintf("other tiers carried %.1f/min, the overflow is at most %.1f", others, overflow))
		}
	default:
		if r.SumFill < sc.MinFill {
			why = append(why, fmt.Sprintf("fill of the sum %.3f", r.SumFill))
		}
		for _, f := range r.Deployments {
			if sc.Each && f.Fill < sc.MinFill {
				why = append(why, fmt.Sprintf("%s fill %.3f", f.Provider, f.Fill))
			}
		}
	}
	if sc.Max429Pct > 0 && r.Pct429 > sc.Max429Pct {
		why = append(why, fmt.Sprintf("429s %s", pct(r.Pct429)))
	}
	if r.Failed > 0 || r.Unfinished > 0 {
		why = append(why, fmt.Sprintf("%d failed, %d unfinished", r.Failed, r.Unfinished))
	}
	r.Pass, r.Why = len(why) == 0, strings.Join(why, "; ")
}

// SteadyFrom is the end of the first steady window: the first minute and
// the fleet's first half-minute of ramp are left out, as in the
// anthropic-cache scenario.
const SteadyFrom = 90

// steadyWindows are the ends of the trailing-60-s windows a run is judged
// on: from SteadyFrom to the end of the offer, or of the backlog when it
// outlasts the offer (the last second every deployment still admitted,
// less two).
func steadyWindows(stats []sim.ModelStats, offerFor time.Duration) (from, to int) {
	backlog := -1
	for _, ms := range stats {
		last := -1
		for i, sec := range ms.Timeline {
			if sec.Admitted > 0 {
				last = i
			}
		}
		if backlog < 0 || last < backlog {
			backlog = last
		}
	}
	return SteadyFrom, max(int(offerFor.Seconds()), backlog-2)
}

// WriteDeployments prints r.
func WriteDeployments(w io.Writer, r *DeploymentsResult) {
	sc := r.Scenario
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL (" + r.Why + ")"
	}
	fmt.Fprintf(w, "%s: %s; %d jobs at %.0f/min for %s\n", sc.Name, sc.Description, r.Jobs, sc.PerMinute, sc.OfferFor)
	fmt.Fprintf(w, "  %-6s %4s %5s %8s %10s %9s %6s\n", "deploy", "tier", "rpm", "fill", "succ/min", "attempts", "429s")
	for _, f := range r.Deployments {
		fmt.Fprintf(w, "  %-6s %4d %5d %8.3f %10.1f %9d %5s\n", f.Provider, f.Tier, f.RPM, f.Fill, f.PerMinute, f.Attempts, pct(f.Pct429))
	}
	fmt.Fprintf(w, "  sum fill %.3f over %d steady windows, %s 429s, %d succeeded, %d failed, %d unfinished; %.1fs\n",
		r.SumFill, r.Windows, pct(r.Pct429), r.Succeeded, r.Failed, r.Unfinished, r.WallS)
	fmt.Fprintf(w, "  target %s: %s\n", sc.Target(), verdict)
}
