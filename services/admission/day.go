package admission

import (
	"context"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/pkg/job"
)

// modelDayKey is the budgets key of a model's per-day quota.
func modelDayKey(provider, model string) string {
	return "model." + provider + "." + job.ModelToken(model) + ".day"
}

// dayHold is the per-day quota a model's candidates took, so that what its
// pacing then refuses goes back.
type dayHold struct {
	key   string
	slice int64
	costs map[*Candidate]budget.Cost
}

// modelDayGate applies a model's per-day quota (rpd, tpd; a trailing 24 h
// shared by the fleet, in the tenants' day store) to its candidates, in
// order. A provider's per-day 429 is no rate to adapt to and no retry
// within minutes cures it, so jobs over the quota wait in the queue by
// redelivery delay (checked again every minute at most, as other
// processes may give quota back) or expire when it frees after their
// deadline. The tenant budget of a job refused here goes back.
func (s *Service) modelDayGate(ctx context.Context, provider string, model *config.Model, cands []*Candidate, held map[string]*tenantHold) ([]*Candidate, *dayHold, error) {
	if !model.HasDayQuota() || len(cands) == 0 {
		return cands, nil, nil
	}
	key := modelDayKey(provider, model.Name)
	// Jobs that paid when first placed (job.Job.Gated) pass free.
	var ungated []*Candidate
	for _, c := range cands {
		if !c.Job.Gated {
			ungated = append(ungated, c)
		}
	}
	if len(ungated) == 0 {
		return cands, nil, nil
	}
	costs := make([]budget.Cost, len(ungated))
	for i, c := range ungated {
		// A day quota counts requests and tokens only.
		costs[i] = budget.Cost{Requests: c.Cost.Requests, Tokens: c.Cost.Tokens}
	}
	g, err := s.tenantTake(ctx, s.tenantDay, key, budget.Limits{RPM: model.RPD, TPM: model.TPD}, costs)
	if err != nil {
		return nil, nil, err
	}
	h := &dayHold{key: key, slice: g.Slice, costs: make(map[*Candidate]budget.Cost, g.N)}
	for i, c := range ungated[:g.N] {
		h.costs[c] = costs[i]
	}
	refused := ungated[g.N:]
	s.giveBack(ctx, held, refused)
	now := s.now()
	out := cands[:0:0]
	for _, c := range cands {
		if _, took := h.costs[c]; took || c.Job.Gated {
			out = append(out, c)
		}
	}
	for _, c := range refused {
		s.deferUntil(ctx, c, now, g.RetryAt, "model_day_"+g.Reason, "the model's per-day quota")
	}
	return out, h, nil
}

// dayGiveBack returns the per-day quota of candidates the model's pacing
// refused after the day gate let them through.
func (s *Service) dayGiveBack(ctx context.Context, h *dayHold, refused []*Candidate) {
	if h == nil || len(refused) == 0 {
		return
	}
	var back budget.Cost
	for _, c := range refused {
		back = back.Plus(h.costs[c])
	}
	if back.Positive() {
		s.tenantReturn(ctx, s.tenantDay, h.key, h.slice, back)
	}
}
