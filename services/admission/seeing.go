package admission

import (
	"context"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/pkg/job"
)

// FillEvery is how often admission reports each deployment's fill and
// cooldown (sluice_deployment_fill, sluice_deployment_cooldown_until_seconds).
const FillEvery = 2 * time.Second

// watchDeployments reports, every FillEvery until ctx ends, what share of
// its limits in effect each deployment's window holds, and until when the
// fleet's health skips it. The limits are the ones the scheduler last
// computed (effective); a deployment it has not placed on yet is measured
// against its configured limits.
func (pl *placer) watchDeployments(ctx context.Context) {
	t := time.NewTicker(FillEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := pl.now()
		for _, p := range pl.app().Providers {
			for _, m := range p.Models {
				lim := [2]int{m.RPM, m.TPM}
				key := budget.ModelKey(p.Name, job.ModelToken(m.Name))
				if v, ok := pl.inEffect.Load(key); ok {
					lim = v.([2]int)
				}
				rctx, cancel := context.WithTimeout(ctx, time.Second)
				used, err := pl.store.Used(rctx, key)
				cancel()
				if err == nil {
					for i, dim := range []string{"requests", "tokens"} {
						v := [2]int{used.Requests, used.Tokens}[i]
						if lim[i] > 0 {
							pl.m.DeploymentFill.WithLabelValues(p.Name, m.Name, dim).Set(float64(v) / float64(lim[i]))
						}
					}
				}
				pl.m.DeploymentCooldown.WithLabelValues(p.Name, m.Name).Set(pl.cooldown(p.Name, m.Name, now))
			}
		}
	}
}

// cooldown is the cooldown gauge's value for provider/model at now.
func (pl *placer) cooldown(provider, model string, now time.Time) float64 {
	if pl.health == nil {
		return 0
	}
	until, _, blocked := pl.health.Blocked(provider, model, now)
	switch {
	case !blocked:
		return 0
	case until.IsZero():
		return -1
	}
	return float64(until.UnixMilli()) / 1000
}
