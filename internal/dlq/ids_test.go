package dlq_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Two tenants dead-letter a job with the same id: both entries are kept
// (the message ids name the tenant), an id without its tenant is refused
// as ambiguous, and each tenant's entry is read and replayed on its own.
func TestSameIDTwoTenants(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, g := entry("acme"), entry("globex")
	g.Job.ID = a.Job.ID
	f.publish(t, a, g)

	all, err := dlq.List(f.ctx, f.js, dlq.Filter{})
	if err != nil || len(all) != 2 {
		t.Fatalf("List: %d entries, %v; want both tenants' entries", len(all), err)
	}
	if _, err := dlq.Get(f.ctx, f.js, "", a.Job.ID); err == nil || errors.Is(err, job.ErrNotFound) || !strings.Contains(err.Error(), "acme, globex") {
		t.Errorf("Get without a tenant = %v; want an error naming both tenants", err)
	}
	for _, tenant := range []string{"acme", "globex"} {
		l, err := dlq.Get(f.ctx, f.js, tenant, a.Job.ID)
		if err != nil || l.Job.Tenant != tenant {
			t.Errorf("Get(%s) = %+v, %v; want %s's entry", tenant, l, err, tenant)
		}
	}
	if _, err := dlq.Replay(f.ctx, f.js, []string{a.Job.ID}, "", nil); err == nil {
		t.Error("Replay of the id without a tenant: no error")
	}
	rep, err := dlq.Replay(f.ctx, f.js, []string{a.Job.ID}, "globex", nil)
	if err != nil || len(rep.Replayed) != 1 || rep.Replayed[0].Tenant != "globex" {
		t.Fatalf("Replay as globex = %+v, %v; want globex's job replayed", rep, err)
	}
	if n := len(f.intake(t, "globex")); n != 1 {
		t.Errorf("INTAKE holds %d messages for globex, want 1", n)
	}
	left, err := dlq.List(f.ctx, f.js, dlq.Filter{})
	if err != nil || len(left) != 1 || left[0].Job.Tenant != "acme" {
		t.Errorf("DLQ after globex's replay = %+v, %v; want acme's entry only", left, err)
	}
	if l, err := dlq.Get(f.ctx, f.js, "", a.Job.ID); err != nil || l.Job.Tenant != "acme" {
		t.Errorf("Get without a tenant, one left = %+v, %v; want acme's", l, err)
	}
}
