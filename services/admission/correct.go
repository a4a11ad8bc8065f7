package admission

import (
	"context"
	"time"

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
	return co.cfg.Calib.Factor(context.Background(), correctionWait, provider, job.ModelToken(j.Model), class)
}

// place sets c's parts and cost as placed now: its estimate's claim with
// the prompt corrected, never above the model's configured minute of
// tokens (more could never be placed).
func (co *coster) place(ms *modelState, c *Candidate) {
	j := c.Job
	c.held = ms.rule.Claim(j.Estimate)
	if f := co.correction(ms.provider, j); f != 1 {
		limit := 0
		if _, m, ok := co.app().Deployment(ms.provider, ms.model); ok {
			limit = m.TokenLimit()
		}
		c.held = ms.rule.Place(c.held, calib.Placed(j.Estimate.PromptTokens, f), limit)
	}
	c.Cost = ms.rule.Cost(c.held)
}
