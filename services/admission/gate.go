package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Before its model places a job, the job passes its gates: its tenant's
// budget per minute and per day and the model's per-day quota (rpd, tpd),
// each a window the fleet shares, leased in blocks like a model's schedule.
// A gate that refuses a job sends it back to QUEUE to wait (checked again
// within a minute, as other processes may give budget back) or expires it
// when what it waits for frees after its deadline. What the gates took
// goes back when a later gate or the model's pacing refuses the job.
//
// A provider's per-day 429 is no rate to adapt to, and no retry within
// minutes cures it: that is why a model's day quota is a gate, not a limit
// the schedule adapts.

// gates owns a job's passage through its budget gates (the tenant's
// minute and day, the model's day quota): what each takes, what goes back
// when a later one refuses, and sending a refused job back to QUEUE to
// wait, or ending it when it would wait past its deadline.
type gates struct {
	*env
	tblocks   map[string]*budget.Lease // per gate window key: this process's block
	tenantMin *budget.Store            // tenants' per-minute windows
	tenantDay *budget.Store            // tenants' per-day windows
	tracer    *tracer
	exits     *exits
	waitBook  *waitBook
}

// gate is one budget a job takes from before it is placed.
type gate struct {
	st     *budget.Store
	key    string
	lim    budget.Limits
	cost   budget.Cost // what the job takes from it
	reason string      // the wait reason's prefix when it refuses
	what   string      // what the job waits for, in an expiry's message
	// modelDay: the deployment's own day quota, which another deployment
	// of its group does not share.
	modelDay bool
}

// passage is what a job took from a gate, to give back.
type passage struct {
	gate  gate
	slice int64 // the slice it was taken in
}

func tenantMinuteKey(tenant string) string { return keys.TenantMinute(tenant) }
func tenantDayKey(tenant string) string    { return keys.TenantDay(tenant) }

// modelDayKey is the budgets key of a model's per-day quota.
func modelDayKey(provider, model string) string {
	return keys.ModelDay(provider, job.ModelToken(model))
}

// gatesFor lists the gates c passes, in order, before the model of
// provider places it. A job that paid when first placed (task.Task.Gated)
// passes free.
func (gt *gates) gatesFor(c *Candidate, provider string, model *config.Model) []gate {
	if c.Job.Gated {
		return nil
	}
	var gs []gate
	if t, ok := gt.app().Tenant(c.Job.Tenant); ok {
		// Tenant budgets count requests and tokens (input and output) only.
		cost := budget.Cost{Requests: c.Cost.Requests, Tokens: c.Cost.Tokens + c.Cost.Output}
		if t.RPM > 0 || t.TPM > 0 {
			gs = append(gs, gate{st: gt.tenantMin, key: tenantMinuteKey(c.Job.Tenant), lim: budget.Limits{RPM: t.RPM, TPM: t.TPM},
				cost: cost, reason: "tenant_", what: "tenant budget"})
		}
		if t.RPD > 0 || t.TPD > 0 {
			gs = append(gs, gate{st: gt.tenantDay, key: tenantDayKey(c.Job.Tenant), lim: budget.PerWindow(t.RPD, t.TPD),
				cost: cost, reason: "tenant_day_", what: "tenant budget"})
		}
	}
	if model.HasDayQuota() {
		// A day quota counts requests and tokens only; it is kept in the
		// tenants' day store.
		gs = append(gs, gate{st: gt.tenantDay, key: modelDayKey(provider, model.Name), lim: budget.PerWindow(model.RPD, model.TPD),
			cost: budget.Cost{Requests: c.Cost.Requests, Tokens: c.Cost.Tokens}, reason: "model_day_", what: "the model's per-day quota", modelDay: true})
	}
	return gs
}

// passGates takes c's cost from each gate in order and returns what was
// taken. A gate that refuses c defers it (deferUntil), and passed is
// false; then, as on an error from the budget store, what the gates before
// took goes back.
func (gt *gates) passGates(ctx context.Context, c *Candidate, gates []gate) (taken []passage, passed bool, err error) {
	taken, passed, _, err = gt.passGatesOn(ctx, c, gates, false)
	return taken, passed, err
}

// passGatesOn is passGates for a job placed on one deployment of several
// (soft): a refusal by that deployment's own day quota does not defer the
// job but returns the quota's grant (day), for the job to try another.
func (gt *gates) passGatesOn(ctx context.Context, c *Candidate, gates []gate, soft bool) (taken []passage, passed bool, day *budget.Grant, err error) {
	for _, g := range gates {
		grant, err := gt.take(ctx, g)
		if err != nil {
			gt.giveBack(ctx, taken)
			return nil, false, nil, err
		}
		if grant.N == 0 {
			gt.giveBack(ctx, taken)
			if soft && g.modelDay {
				return nil, false, &grant, nil
			}
			gt.deferUntil(ctx, c, gt.now(), grant.RetryAt, gateReason(g.reason, grant.Reason), g.what)
			return nil, false, nil, nil
		}
		taken = append(taken, passage{gate: g, slice: grant.Slice})
	}
	return taken, true, nil, nil
}

// take grants g's cost from this process's block of g's window, else with
// one compare-and-set for it plus the demand expected there in the slice.
func (gt *gates) take(ctx context.Context, g gate) (budget.Grant, error) {
	l := gt.tblocks[g.key]
	if l == nil {
		l = budget.NewLease(g.st, g.key)
		gt.tblocks[g.key] = l
	}
	now := gt.now()
	l.Count(g.cost, false, now)
	if _, ok := l.Spend(g.cost, false, now, 0); ok {
		return budget.Grant{N: 1, Slice: g.st.SliceOf(now)}, nil
	}
	d := l.Demand(false, now)
	return l.Take(ctx, g.lim, []budget.Cost{g.cost}, demandChunks(d.Minus(g.cost)), false, 0)
}

// giveBack returns what a job took from its gates: to this process's block
// while the slice it was taken in lasts, else to the shared window.
func (gt *gates) giveBack(ctx context.Context, taken []passage) {
	for _, p := range taken {
		if l := gt.tblocks[p.gate.key]; l != nil {
			l.Refund(ctx, budget.Block{Slice: p.slice}, p.gate.cost, gt.now())
			continue
		}
		_ = p.gate.st.Return(ctx, p.gate.key, p.slice, p.gate.cost)
	}
}

// deferUntil sends a job a budget gate refused back to QUEUE until retry
// (checked again within a minute, as other processes may give budget
// back), or expires it if what it waits for frees after its deadline.
func (gt *gates) deferUntil(ctx context.Context, c *Candidate, now, retry time.Time, reason, what string) {
	gt.m.AdmissionWaits.WithLabelValues(c.Job.Provider, c.Job.Model, reason).Inc()
	c.wait.note(reason)
	wait := max(retry.Sub(now), 50*time.Millisecond) + jitter(gt.store.Params().Slice)
	if dl := c.Job.Deadline; dl != nil && now.Add(wait).After(*dl) {
		gt.exits.expire(gt.tracer.leave(ctx, c, "expired"), c.Msg, c.Job, fmt.Sprintf("%s (%s) frees after the deadline", what, reason))
		return
	}
	gt.waitBook.noteWait(c.Job.Key(), reason, retry)
	wait = min(wait, time.Minute)
	gt.tracer.endWait(&c.wait, now.Add(wait), "deferred") // until it comes back
	_ = c.Msg.NakWithDelay(wait)
}
