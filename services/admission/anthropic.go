package admission

import (
	"context"

	"github.com/sluice-dev/sluice/internal/promptcache"
	"github.com/sluice-dev/sluice/pkg/job"
)

// A model whose provider limits input and output tokens apart (Anthropic:
// ITPM, OTPM) is charged on its tokens dimension the input (the prompt
// estimate) and on its output dimension max_tokens, which Anthropic's
// thinking budget is part of; the executor corrects both to the usage
// reported. Anthropic does not count cache reads toward ITPM (unless the
// model's cache_reads_count says it does), so a request whose cacheable
// prefix the provider recently wrote is reserved net of that prefix.

// netOfCache sets, at placement, the input each candidate on a split model
// reserves: its input cost as placedCost made it, less its cacheable
// prefix's share of it when the fleet's registry holds that prefix warm.
func (co *coster) netOfCache(ctx context.Context, ms *modelState, cands []*Candidate) {
	if !ms.rule.CacheFree() {
		return
	}
	key := promptcache.Key(ms.provider, job.ModelToken(ms.model))
	for _, c := range cands {
		j := c.Job
		whole := c.held.Prompt
		c.held.Cached = 0
		p, ok := promptcache.Of(j.Request)
		if !ok || j.Estimate.PromptTokens <= 0 {
			continue
		}
		if _, warm := co.pcache.Warm(ctx, key, p.Hash); !warm {
			continue
		}
		// The prefix's share of the estimate; at least one token stays
		// reserved (the turn after the prefix).
		share := min(float64(p.Tokens)/float64(j.Estimate.PromptTokens), 1)
		c.held.Cached = min(int(float64(whole)*share), max(whole-1, 0))
		c.Cost = ms.rule.Cost(c.held)
	}
}
