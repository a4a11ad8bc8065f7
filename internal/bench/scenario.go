package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// Setup is how the simulated provider enforces a workload's limits and what
// Sluice is told about them. The direct strategies are always told the real
// limits (retry-only needs none).
type Setup struct {
	// Profile is the simulator's profile (sim.Profiles; "" = quantized).
	Profile string `json:"profile"`
	// NoRateHeaders drops the x-ratelimit-* headers (the hidden profile
	// drops them whatever this says).
	NoRateHeaders bool `json:"no_rate_headers,omitempty"`
	// SluiceFactor: Sluice is configured with the real limits times this;
	// 0 means not configured: rpm: 0, tpm: 0, adaptive: true.
	SluiceFactor float64 `json:"sluice_factor"`
	// TokenRatio makes the simulator count the workload's prompts as this
	// many times Sluice's estimate, over the workload (tokens.go); 0: its
	// own count (characters/4), as it is.
	TokenRatio float64 `json:"token_ratio,omitempty"`
	// Reasoning serves the model as a reasoning model: the jobs ask for
	// max_completion_tokens (it refuses max_tokens) and it reports
	// reasoning tokens.
	Reasoning bool `json:"reasoning,omitempty"`
	// Repeats is the share of jobs that repeat an earlier request exactly
	// (repeats.go); Sluice is configured to cache the tenant's answers.
	Repeats float64 `json:"repeats,omitempty"`
}

// DefaultSetup is the workload comparison's: the simulator's default
// (quantized) profile with headers, Sluice told the real limits.
var DefaultSetup = Setup{Profile: sim.ProfileQuantized, SluiceFactor: 1}

func (s Setup) withDefaults() Setup {
	if s.Profile == "" {
		s.Profile = sim.DefaultProfile
	}
	if s.Profile == sim.ProfileHidden {
		s.NoRateHeaders = true
	}
	return s
}

// sluiceLimits are the limits Sluice is configured with for w, and whether
// it discovers them.
func (s Setup) sluiceLimits(w *Workload) (rpm, tpm int, discover bool) {
	if s.SluiceFactor <= 0 {
		return 0, 0, true
	}
	return int(math.Round(float64(w.RPM) * s.SluiceFactor)), int(math.Round(float64(w.TPM) * s.SluiceFactor)), false
}

// Describe says what the provider enforces and what Sluice is told.
func (s Setup) Describe() string {
	s = s.withDefaults()
	headers := "rate headers"
	if s.NoRateHeaders {
		headers = "no rate headers"
	}
	told := "Sluice not told the limits (rpm: 0, tpm: 0, adaptive: true)"
	switch {
	case s.SluiceFactor == 1:
		told = "Sluice told the real limits"
	case s.SluiceFactor > 0:
		told = fmt.Sprintf("Sluice told %gx the real limits", s.SluiceFactor)
	}
	if s.TokenRatio > 0 {
		headers += fmt.Sprintf(", provider counting %gx Sluice's prompt estimate", s.TokenRatio)
	}
	if s.Reasoning {
		headers += ", reasoning model (max_completion_tokens)"
	}
	if s.Repeats > 0 {
		headers += fmt.Sprintf(", %g%% of jobs repeating an earlier request (Sluice caching the tenant's answers)", 100*s.Repeats)
	}
	return fmt.Sprintf("%s profile, %s, %s", s.Profile, headers, told)
}

// Target is what Sluice must achieve in a scenario.
type Target struct {
	// MinFill is the least steady fill of the real binding limit (Goodput).
	MinFill float64 `json:"min_fill"`
	// Max429Pct bounds provider 429s as a percentage of attempts (0 = no
	// bound); After60 counts only the attempts after the first 60 s,
	// After30 after the first 30 s.
	Max429Pct float64 `json:"max_429_pct,omitempty"`
	After60   bool    `json:"after_60s,omitempty"`
	After30   bool    `json:"after_30s,omitempty"`
	// NoLoss requires every job to succeed.
	NoLoss bool `json:"no_loss,omitempty"`
	// DistinctCalls requires one successful provider call per distinct
	// request (Result.Distinct): repeats are answered without a call.
	DistinctCalls bool `json:"distinct_calls,omitempty"`
}

// String is the target in a table cell, e.g. "≥97% fill, ≤0.5% 429s, 0 lost".
func (t Target) String() string {
	parts := []string{fmt.Sprintf("≥%s fill", pct(t.MinFill*100))}
	if t.Max429Pct > 0 {
		p := fmt.Sprintf("≤%s 429s", pct(t.Max429Pct))
		if t.After60 {
			p += " after 60s"
		}
		if t.After30 {
			p += " after 30s"
		}
		parts = append(parts, p)
	}
	if t.NoLoss {
		parts = append(parts, "0 lost")
	}
	if t.DistinctCalls {
		parts = append(parts, "calls = distinct requests")
	}
	return strings.Join(parts, ", ")
}

// pct formats a percentage with the decimals it needs: 97%, 0.5%.
func pct(v float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".") + "%"
}

// Verdict is how a lane did against its scenario's target.
type Verdict struct {
	Pass bool `json:"pass"`
	// Misses names each part of the target missed, with the figure.
	Misses []string `json:"misses,omitempty"`
}

// Check judges r against t. The 429 bound after 60 s falls back to every
// attempt when the run had none after its first 60 s.
func (t Target) Check(r Result) Verdict {
	var misses []string
	if r.Goodput < t.MinFill {
		misses = append(misses, fmt.Sprintf("fill %.1f%%", 100*r.Goodput))
	}
	if t.Max429Pct > 0 {
		got, what := r.Pct429, "429s"
		if t.After60 && r.AttemptsAfter60 > 0 {
			got, what = r.Pct429After60, "429s after 60s"
		}
		if t.After30 && r.AttemptsAfter30 > 0 {
			got, what = r.Pct429After30, "429s after 30s"
		}
		if got > t.Max429Pct {
			misses = append(misses, fmt.Sprintf("%s %s", what, pct(got)))
		}
	}
	if t.NoLoss && r.Lost > 0 {
		misses = append(misses, fmt.Sprintf("%d lost", r.Lost))
	}
	if t.DistinctCalls && r.Successes != int64(r.Distinct) {
		misses = append(misses, fmt.Sprintf("%d successful calls for %d distinct requests", r.Successes, r.Distinct))
	}
	return Verdict{Pass: len(misses) == 0, Misses: misses}
}

// String is the verdict in a table cell: "pass" or "FAIL: fill 95.1%".
func (v Verdict) String() string {
	if v.Pass {
		return "pass"
	}
	return "FAIL: " + strings.Join(v.Misses, ", ")
}

// Scenario is a workload run against a provider profile with Sluice told
// the real limits, wrong ones, or none, and what Sluice must achieve there.
type Scenario struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Workload is the name of the Specs entry the scenario runs by default.
	Workload string `json:"workload"`
	Setup
	Target Target `json:"target"`
}

// Scenarios are the scenarios `sluice bench` knows, in the order it runs
// them. Each runs the workload that tests it best: a presses RPM with a
// per-second quantum equal to its pace, b presses TPM with requests larger
// than the per-second token quantum.
var Scenarios = []Scenario{
	{Name: "known", Description: "quantized provider, Sluice configured with the real limits", Workload: "a",
		Setup: Setup{Profile: sim.ProfileQuantized, SluiceFactor: 1}, Target: Target{MinFill: 0.97, Max429Pct: 0.5, NoLoss: true}},
	{Name: "twice", Description: "quantized provider with headers, Sluice configured with twice the real limits", Workload: "b",
		Setup: Setup{Profile: sim.ProfileQuantized, SluiceFactor: 2}, Target: Target{MinFill: 0.90, Max429Pct: 2, After60: true}},
	{Name: "discover", Description: "quantized provider with headers, Sluice configured rpm: 0, tpm: 0, adaptive: true", Workload: "a",
		Setup: Setup{Profile: sim.ProfileQuantized, SluiceFactor: 0}, Target: Target{MinFill: 0.90}},
	{Name: "hidden", Description: "quantized provider without rate headers, Sluice configured with twice the real limits", Workload: "a",
		Setup: Setup{Profile: sim.ProfileHidden, NoRateHeaders: true, SluiceFactor: 2}, Target: Target{MinFill: 0.85, Max429Pct: 3}},
	{Name: "token-bucket", Description: "token-bucket provider (1 s of refill), Sluice configured with the real limits", Workload: "b",
		Setup: Setup{Profile: sim.ProfileTokenBucket, SluiceFactor: 1}, Target: Target{MinFill: 0.95, Max429Pct: 1}},
	{Name: "azure", Description: "Azure-style provider (10-s windows at limit/6), Sluice configured with the real limits", Workload: "a",
		Setup: Setup{Profile: sim.ProfileAzure, SluiceFactor: 1}, Target: Target{MinFill: 0.95, Max429Pct: 1}},
	{Name: "tokens-high", Description: "quantized provider counting 15% more prompt tokens than Sluice estimates, Sluice configured with the real limits", Workload: "b",
		Setup: Setup{Profile: sim.ProfileQuantized, SluiceFactor: 1, TokenRatio: 1.15}, Target: Target{MinFill: 0.95, Max429Pct: 0.5, After30: true, NoLoss: true}},
	{Name: "tokens-low", Description: "quantized provider counting 40% fewer prompt tokens than Sluice estimates, Sluice configured with the real limits", Workload: "b",
		Setup: Setup{Profile: sim.ProfileQuantized, SluiceFactor: 1, TokenRatio: 0.6}, Target: Target{MinFill: 0.95}},
	{Name: "reasoning", Description: "quantized reasoning model (max_completion_tokens, reasoning tokens reported), Sluice configured with the real limits", Workload: "b",
		Setup: Setup{Profile: sim.ProfileQuantized, SluiceFactor: 1, Reasoning: true}, Target: Target{MinFill: 0.95}},
	{Name: "repeats", Description: "quantized provider, Sluice configured with the real limits and caching; 30% of jobs repeat an earlier request", Workload: "a",
		Setup: Setup{Profile: sim.ProfileQuantized, SluiceFactor: 1, Repeats: 0.3}, Target: Target{MinFill: 0.97, Max429Pct: 0.5, NoLoss: true, DistinctCalls: true}},
}

// ScenarioNames lists the names of Scenarios.
func ScenarioNames() []string {
	var out []string
	for _, s := range Scenarios {
		out = append(out, s.Name)
	}
	return out
}

// LookupScenario returns the scenario named name.
func LookupScenario(name string) (Scenario, bool) {
	i := slices.IndexFunc(Scenarios, func(s Scenario) bool { return s.Name == name })
	if i < 0 {
		return Scenario{}, false
	}
	return Scenarios[i], true
}

// ParseScenarios reads a --scenario value: "all", "none", or a
// comma-separated list of NAME or NAME:WORKLOAD (the scenario on another
// workload than its own).
func ParseScenarios(s string) ([]Scenario, error) {
	switch strings.TrimSpace(s) {
	case "all":
		return slices.Clone(Scenarios), nil
	case "none", "":
		return nil, nil
	}
	var out []Scenario
	for _, item := range strings.Split(s, ",") {
		name, workload, _ := strings.Cut(strings.TrimSpace(item), ":")
		sc, ok := LookupScenario(name)
		if !ok {
			return nil, fmt.Errorf("unknown scenario %q (want %s, all or none)", name, strings.Join(ScenarioNames(), ", "))
		}
		if workload != "" {
			if _, ok := LookupSpec(workload); !ok {
				return nil, fmt.Errorf("scenario %s: unknown workload %q (want %s)", name, workload, strings.Join(SpecNames(), ", "))
			}
			sc.Workload = workload
		}
		if !slices.ContainsFunc(out, func(o Scenario) bool { return o.Name == sc.Name && o.Workload == sc.Workload }) {
			out = append(out, sc)
		}
	}
	return out, nil
}

// after60 counts the attempts (admitted or refused) and the 429s of the
// timeline's seconds after the first 60.
func after60(tl []sim.Second) (attempts, limited int64) { return after(tl, 60) }

// after counts the attempts and the 429s of the timeline's seconds after
// the first n.
func after(tl []sim.Second, n int) (attempts, limited int64) {
	for i := n; i < len(tl); i++ {
		attempts += tl[i].Admitted + tl[i].RateLimited
		limited += tl[i].RateLimited
	}
	return attempts, limited
}

// percent is 100·n/d, 0 when d is.
func percent(n, d int64) float64 {
	if d == 0 {
		return 0
	}
	return 100 * float64(n) / float64(d)
}
