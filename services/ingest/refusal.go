package ingest

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/sluice-dev/sluice/pkg/job"
)

// refusalStored reports whether the refusal of an INTAKE job is stored as
// its result: only when the job has a record of this tenant (an earlier
// delivery got that far). A job refused before it had one is unknown, as
// one refused over HTTP is: its refusal goes to a producer listening on the
// result subject and is not kept, so a flood of invalid jobs costs the
// store nothing.
func (s *intake) refusalStored(ctx context.Context, tenant, id string) (bool, error) {
	rec, _, err := s.mesh.Lookup(ctx, tenant, id)
	if errors.Is(err, job.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return rec.Tenant == tenant, nil
}

// announce publishes a result on its result subject without storing it.
func (s *intake) announce(res *job.Result) {
	if res.CompletedAt.IsZero() {
		res.CompletedAt = s.now().UTC()
	}
	if data, err := json.Marshal(res); err == nil {
		_ = s.mesh.JS.Conn().Publish(job.ResultSubject(res.Tenant, res.JobID), data)
	}
}
