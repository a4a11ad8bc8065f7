package ingest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/keys"
)

// A cache hit spends no provider budget. Whether it spends its tenant's is
// the operator's choice (cache.hits_count_in_tenant_budget): on, a hit
// takes one request from the tenant's per-minute and per-day windows, the
// ones admission takes a job's cost from, before it is answered.

// hitStores are the tenants' budget windows, made at the first hit that
// counts.
type hitStores struct {
	once     sync.Once
	min, day *budget.Store
}

// hitCost is what a hit takes: one request, no tokens (no model read or
// wrote any).
var hitCost = budget.Cost{Requests: 1}

// hitBudget takes a hit's request from its tenant's budgets when the
// config says hits count. A budget without room refuses the hit for now:
// a *BusyError saying when it has room. An unreachable budget store lets
// the hit through (the answer is there; the budget is a rationing, and
// its store's failure is logged by those that depend on it).
func (s *responseCache) hitBudget(ctx context.Context, tenant string) error {
	app := s.app()
	t, ok := app.Tenant(tenant)
	if !app.Cache.HitsCountInTenantBudget || !ok || (t.RPM == 0 && t.RPD == 0) || s.mesh.Budgets == nil {
		return nil
	}
	hs := &s.hitStores
	hs.once.Do(func() {
		hs.min = budget.NewStore(s.mesh.Budgets, app.Admission.TenantMinuteParams(), s.now)
		hs.day = budget.NewStore(s.mesh.Budgets, app.Admission.TenantDayParams(), s.now)
	})
	type window struct {
		st    *budget.Store
		key   string
		limit int
		what  string
	}
	var taken []func()
	for _, w := range []window{{hs.min, keys.TenantMinute(tenant), t.RPM, "rpm"}, {hs.day, keys.TenantDay(tenant), t.RPD, "rpd"}} {
		if w.limit == 0 {
			continue
		}
		g, err := w.st.Take(ctx, w.key, budget.Limits{RPM: w.limit}, []budget.Cost{hitCost})
		if err != nil {
			return nil
		}
		if g.N == 0 {
			for _, undo := range taken {
				undo()
			}
			wait := max(g.RetryAt.Sub(s.now()), time.Second)
			return &BusyError{Code: CodeTenantBudget, RetryAfter: wait,
				Message: fmt.Sprintf("the tenant's %s is spent (cache hits count toward it here)", w.what)}
		}
		taken = append(taken, func() { _ = w.st.Return(context.WithoutCancel(ctx), w.key, g.Slice, hitCost) })
	}
	return nil
}

// CodeTenantBudget refuses a cache hit its tenant's budget has no room
// for now.
const CodeTenantBudget = "tenant_budget"
