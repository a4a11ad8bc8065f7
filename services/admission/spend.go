package admission

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// A tenant with a spend budget (config tenants[].spend) has each job's
// worst-case cost on the model it is placed on held in the fleet's spend
// windows (budget.SpendLedger) before the job is dispatched; the result
// service settles the hold to the cost of the usage reported when the job
// ends. A job that does not fit waits (the tenant's on_exceed: wait),
// within a second while held reservations may come back, else until the
// window ends, and expires when that is after its deadline; or it ends at
// once (refuse). A hold is taken whole or not at all: never shrunk to fit.

// spendGate owns the tenants' spend budgets: the worst-case hold a job
// takes in its tenant's spend windows before it is placed, and what
// becomes of one that does not fit (it waits or ends: on_exceed).
type spendGate struct {
	*env
	spend  *budget.SpendLedger // tenants' spend windows
	exits  *exits
	gates  *gates  // deferUntil
	coster *coster // correction
}

// spendCaps are tenant t's spend caps in billionths; ok is false when it
// has none.
func spendCaps(t *config.Tenant) (budget.SpendCaps, bool) {
	if t == nil || t.Spend == nil {
		return budget.SpendCaps{}, false
	}
	c := budget.SpendCaps{PerDay: budget.Nanos(t.Spend.PerDay), PerMonth: budget.Nanos(t.Spend.PerMonth)}
	return c, c.PerDay > 0 || c.PerMonth > 0
}

// holdSpend holds c's worst-case cost on provider's model in its tenant's
// spend windows. placeable says c may go on to be placed; the hold then
// waits in c (spendNext) for publish to put on the job, and what was
// taken now (spendFresh) goes back if c is not placed (dropSpend): until
// it is placed, c's job stays as its QUEUE message has it. A job holding
// enough already (placed before, back for another attempt) passes free;
// one placed now on a dearer model holds the difference too. When c may
// not go on, holdSpend has deferred or ended it, unless err (the budget
// store failed).
func (sg *spendGate) holdSpend(ctx context.Context, c *Candidate, provider string, model *config.Model) (placeable bool, err error) {
	t, _ := sg.app().Tenant(c.Job.Tenant)
	caps, ok := spendCaps(t)
	if !ok {
		return true, nil
	}
	if model.Price == nil || c.Job.Estimate == nil {
		sg.exits.fail(ctx, c, &job.Error{Code: job.CodeSpendBudget, Message: fmt.Sprintf(
			"tenant %q has a spend budget and model %q of provider %q has no price to bound the job's cost by (providers[].models[].price)",
			c.Job.Tenant, model.Name, provider)})
		return false, nil
	}
	est := *c.Job.Estimate
	// The prompt as the provider is expected to count it (the learned
	// correction), if that is more than the estimate.
	est.PromptTokens = max(est.PromptTokens, calib.Placed(est.PromptTokens, sg.coster.correction(provider, c.Job)))
	worst := budget.Nanos(model.Price.WorstCase(est))
	old := c.Job.SpendHold
	need := worst
	if old != nil {
		if old.Amount >= worst {
			return true, nil
		}
		need = worst - old.Amount
	}
	hold, ref, err := sg.spend.Reserve(ctx, c.Job.Tenant, need, caps)
	if err != nil {
		return false, err
	}
	if ref == nil {
		c.spendFresh, c.spendNext = &hold, &hold
		if old != nil && old.Day == hold.Day && old.Month == hold.Month {
			c.spendNext = &task.SpendHold{Amount: worst, Day: hold.Day, Month: hold.Month}
		} else if old != nil {
			// Held in windows since closed: the difference is not enough
			// in today's, so the whole worst case is held there.
			sg.dropSpend(ctx, c)
			return sg.holdWhole(ctx, c, worst, caps, provider, model.Name)
		}
		return true, nil
	}
	sg.spendRefused(ctx, c, t, ref, provider, model.Name)
	return false, nil
}

// holdWhole holds a job's whole worst case in the current windows, for a
// job whose earlier hold is in windows since closed (that one is left
// held: giving it back before the job is placed would leave its QUEUE
// message naming a hold no longer held).
func (sg *spendGate) holdWhole(ctx context.Context, c *Candidate, worst int64, caps budget.SpendCaps, provider, model string) (bool, error) {
	hold, ref, err := sg.spend.Reserve(ctx, c.Job.Tenant, worst, caps)
	if err != nil || ref != nil {
		if ref != nil {
			t, _ := sg.app().Tenant(c.Job.Tenant)
			sg.spendRefused(ctx, c, t, ref, provider, model)
		}
		return false, err
	}
	c.spendFresh, c.spendNext = &hold, &hold
	return true, nil
}

// spendRefused defers (deferUntil counts the wait) or ends c, which its
// tenant's spend budget refused on provider's model.
func (sg *spendGate) spendRefused(ctx context.Context, c *Candidate, t *config.Tenant, ref *budget.SpendRefusal, provider, model string) {
	what := fmt.Sprintf("tenant %q's %s %s", c.Job.Tenant, ref.Error(), sg.app().Currency)
	if t.Spend.OnExceed == config.SpendRefuse {
		sg.m.AdmissionWaits.WithLabelValues(provider, model, "tenant_spend_"+ref.Window).Inc()
		sg.exits.fail(ctx, c, &job.Error{Code: job.CodeSpendBudget, Message: what + "; refused (spend.on_exceed: refuse)"})
		return
	}
	sg.gates.deferUntil(ctx, c, sg.now(), ref.RetryAt, "tenant_spend_"+ref.Window, what)
}

// dropSpend gives back what holdSpend took for c that was not placed.
func (sg *spendGate) dropSpend(ctx context.Context, c *Candidate) {
	if c.spendFresh == nil {
		return
	}
	if err := sg.spend.Settle(ctx, c.Job.Tenant, *c.spendFresh, 0); err != nil {
		sg.log.Warn("spend hold not given back; it stays held until its window ends", "job_id", c.Job.ID, "err", err)
	}
	c.spendFresh, c.spendNext = nil, nil
}
