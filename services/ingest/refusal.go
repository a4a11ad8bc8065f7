package ingest

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// refusalStored reports whether the refusal of an INTAKE job is stored as
// its result: only when the job has a record of this tenant (an earlier
// delivery got that far), whose submission time it returns. A job refused
// before it had one is unknown, as one refused over HTTP is: its refusal
// goes to a producer listening on the result subject and is not kept, so a
// flood of invalid jobs costs the store nothing.
func (s *intake) refusalStored(ctx context.Context, tenant, id string) (bool, time.Time, error) {
	rec, _, err := s.mesh.Lookup(ctx, tenant, id)
	if errors.Is(err, job.ErrNotFound) {
		return false, time.Time{}, nil
	}
	if err != nil {
		return false, time.Time{}, err
	}
	return rec.Tenant == tenant, rec.SubmittedAt, nil
}

// refused is the job an INTAKE refusal ends: the id it is answered under,
// the tenant of its subject, submitted when its record says (zero: now,
// the refusal being its submission). Nothing else of it is believed: it
// was never placed.
func refused(tenant, id string, submitted, now time.Time) *task.Task {
	if submitted.IsZero() {
		submitted = now.UTC()
	}
	return &task.Task{Job: job.Job{ID: id, Tenant: tenant}, SubmittedAt: submitted}
}
