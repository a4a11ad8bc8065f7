package admission

import (
	"context"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/internal/promptcache"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// coster owns what a job reserves when it is placed: its estimate as the
// fleet's token correction corrects it (internal/calib), net of a prompt
// prefix the provider's cache holds warm (anthropic.go).
type coster struct {
	*env
	pcache *promptcache.Registry // warm prompt prefixes (anthropic.go)
}

// correctionWait bounds a read of the fleet's correction (at most one per
// key per calib.CacheFor); past it the cached value stands.
const correctionWait = 250 * time.Millisecond

// correction is the factor the fleet's token correction (internal/calib)
// applies to j's prompt estimate now: the estimate frozen in the envelope
// is Sluice's own count, and what the provider will charge is learned from
// every answer since, so a job queued before the fleet learned is placed
// with what it knows when it places it.
func (co *coster) correction(provider string, j *task.Task) float64 {
	if co.cfg.Calib == nil || j.Estimate == nil {
		return 1
	}
	class := j.Estimate.Class
	if !tokens.ValidClass(class) {
		class = "" // whoever wrote it, it names no key
	}
	ctx, cancel := context.WithTimeout(context.Background(), correctionWait)
	defer cancel()
	return co.cfg.Calib.Factor(ctx, provider, job.ModelToken(j.Model), class)
}

// placedCost is what j reserves when placed now: costOf with the prompt
// estimate corrected, never above the model's configured minute of tokens
// (more could never be placed).
func (co *coster) placedCost(ms *modelState, j *task.Task) budget.Cost {
	c := ms.costOf(j)
	f := co.correction(ms.provider, j)
	if f == 1 || j.Estimate == nil {
		return c
	}
	c.Tokens = calib.Placed(j.Estimate.PromptTokens, f)
	whole := j.Estimate.Cost()
	if ms.splits {
		whole = j.Estimate.PromptTokens // the output is reserved apart
	} else {
		c.Tokens += j.Estimate.MaxTokens
	}
	if _, m, ok := co.app().Deployment(ms.provider, ms.model); ok && m.TokenLimit() > 0 {
		c.Tokens = min(c.Tokens, max(m.TokenLimit(), whole))
	}
	return c
}
