package bench

import (
	"encoding/json"
	"fmt"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// tokenCount is how a setup's simulators count w's prompts: their own
// count (characters/4, sim.CountChars), scaled when setup.TokenRatio is set
// so that over w's prompts they count TokenRatio times what Sluice
// estimates (each prompt still differs from its estimate on its own).
func (s Setup) tokenCount(w *Workload) (sim.TokenCount, error) {
	c := sim.TokenCount{Mode: sim.CountChars, Factor: 1}
	if s.TokenRatio <= 0 {
		return c, nil
	}
	var est, own int
	for _, j := range w.Jobs {
		req, err := job.ParseRequest(j.Body, job.Limits{})
		if err != nil {
			return c, err
		}
		est += tokens.Prompt(req)
		own += c.Prompt(req)
	}
	if own == 0 {
		return c, fmt.Errorf("workload %s has no prompt", w.Name)
	}
	c.Factor = s.TokenRatio * float64(est) / float64(own)
	return c, nil
}

// reasoningJobs returns w's jobs asking for max_completion_tokens instead
// of max_tokens, as a reasoning model requires.
func reasoningJobs(jobs []Job) ([]Job, error) {
	out := make([]Job, len(jobs))
	for i, j := range jobs {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(j.Body, &m); err != nil {
			return nil, err
		}
		if v, ok := m["max_tokens"]; ok {
			m["max_completion_tokens"] = v
			delete(m, "max_tokens")
		}
		b, err := json.Marshal(m)
		if err != nil {
			return nil, err
		}
		j.Body = b
		out[i] = j
	}
	return out, nil
}

// LoadFor is the --load a scenario generates its workload at: a provider
// counting otherwise than Sluice estimates sees the workload larger or
// smaller, so it is offered at load / TokenRatio by Sluice's count, for the
// provider to see about load times its binding limit (as in the other
// scenarios, within the run's deadline).
func (s Scenario) LoadFor(load float64) float64 {
	if s.TokenRatio > 0 {
		return load / s.TokenRatio
	}
	if s.Repeats > 0 {
		// The distinct work is what reaches the provider: it is offered
		// at load, the repeats on top.
		return load / (1 - s.Repeats)
	}
	return load
}
