package mesh_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Records are kept per tenant: the same id names two jobs. A record kept
// under the bare id (before ids were scoped by tenant) is still read for
// its own tenant only, and never as the record a writer updates.
func TestLookupPerTenant(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{})
	id, legacy := job.NewID(), job.NewID()
	for _, tenant := range []string{"acme", "beta"} {
		if _, err := m.Results.Create(ctx, keys.Record(tenant, id), []byte(`{"job_id":"`+id+`","tenant":"`+tenant+`","status":"queued"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Results.Create(ctx, keys.LegacyRecord(legacy), []byte(`{"job_id":"`+legacy+`","tenant":"acme","status":"succeeded"}`)); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"acme", "beta"} {
		if r, _, err := m.Lookup(ctx, tenant, id); err != nil || r.Tenant != tenant {
			t.Errorf("Lookup(%s, id) = %+v, %v; want %s's record", tenant, r, err, tenant)
		}
	}
	if r, rev, err := m.Lookup(ctx, "acme", legacy); err != nil || r.Tenant != "acme" || rev != 0 {
		t.Errorf("Lookup(acme, legacy) = %+v at %d, %v; want acme's legacy record, at revision 0", r, rev, err)
	}
	if _, _, err := m.Lookup(ctx, "beta", legacy); !errors.Is(err, job.ErrNotFound) {
		t.Errorf("Lookup(beta, acme's legacy id) = %v, want ErrNotFound", err)
	}
	if _, _, err := m.LookupRecord(ctx, "acme", legacy); !errors.Is(err, job.ErrNotFound) {
		t.Errorf("LookupRecord(acme, legacy) = %v, want ErrNotFound (a writer creates the tenant's key)", err)
	}
}
