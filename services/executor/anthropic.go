package executor

import (
	"context"

	"github.com/sluice-dev/sluice/internal/promptcache"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// recordPrefix notes, for a request with a cache breakpoint, what the
// provider read from and wrote to its cache, and keeps the prefix warm in
// the fleet's registry when it did either.
func (s *feedback) recordPrefix(ctx context.Context, j *task.Task, u job.Usage) {
	p, ok := promptcache.Of(j.Request)
	if !ok {
		return
	}
	uncached := max(u.PromptTokens-u.CachedTokens-u.CacheWriteTokens, 0)
	for kind, n := range map[string]int{"read": u.CachedTokens, "write": u.CacheWriteTokens, "uncached": uncached} {
		s.m.PromptCache.WithLabelValues(j.Provider, j.Model, j.Tenant, kind).Add(float64(n))
	}
	if u.CachedTokens == 0 && u.CacheWriteTokens == 0 {
		return
	}
	key := promptcache.Key(j.Provider, job.ModelToken(j.Model))
	if err := s.pcache.Record(ctx, key, p.Hash, u.CachedTokens+u.CacheWriteTokens, p.TTL); err != nil {
		s.log.Debug("prompt cache registry", "job_id", j.ID, "err", err)
	}
}
