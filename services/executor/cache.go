package executor

import (
	"context"

	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// storeAnswer keeps a job's answer in the response cache when ingest gave
// the job a cache target (the cache checks that it is a complete answer).
// It runs before the result is published, so a request that follows the
// result finds the entry; the answer is delivered whether or not it is
// stored.
func (s *Service) storeAnswer(ctx context.Context, j *task.Task, r *job.Result) {
	if s.cfg.Cache == nil || j.CacheTarget == nil {
		return
	}
	s.cfg.Cache.Store(context.WithoutCancel(ctx), s.app(), j.Tenant, j.CacheTarget, r)
}
