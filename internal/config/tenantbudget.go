package config

import (
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
)

// TenantMinuteParams and TenantDayParams shape the tenants' budget windows
// (tenants[].rpm, tpm and rpd, tpd). Every process that takes from them
// uses these: admission for jobs, ingest for cache hits.
func (a Admission) TenantMinuteParams() budget.Params {
	return budget.Params{Slice: a.Slice.D(), DispatchGrace: a.tenantGrace(), BurstFraction: 1}
}

// TenantDayParams: see TenantMinuteParams.
func (a Admission) TenantDayParams() budget.Params {
	return budget.Params{Window: 24 * time.Hour, Slice: time.Minute, DispatchGrace: a.tenantGrace(), BurstFraction: 1}
}

// tenantGrace: a model's lease may land one slice after its tenant's.
func (a Admission) tenantGrace() time.Duration { return a.DispatchGrace.D() + a.Slice.D() }
