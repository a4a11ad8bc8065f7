package executor

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/promptcache"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// settleSplit settles a call to a model whose provider limits input and
// output tokens apart (Anthropic), as that provider charges it: the input
// limit counts input_tokens + cache_creation_input_tokens (cache reads
// too when the model's cache_reads_count says so), the output limit the
// output tokens reported (max_tokens was charged at arrival and is
// corrected at the end). What the reservation held beyond that goes back
// to the schedule, what it missed is charged. It also records a prompt
// prefix the provider reported reading or writing, for the fleet's next
// reservations. It reports false for other models (settled as before).
func (s *Service) settleSplit(ctx context.Context, j *task.Task, u job.Usage) bool {
	_, model, ok := s.app().Deployment(j.Provider, j.Model)
	if !ok || !model.SplitsOutput() {
		return false
	}
	r := j.Reservation
	charged := u.PromptTokens
	if !model.CacheReadsCount {
		charged -= u.CachedTokens
	}
	key := budget.ModelKey(j.Provider, job.ModelToken(j.Model))
	var extra, back budget.Cost
	if d := charged - r.Tokens; d > 0 {
		extra.Tokens = d
	} else {
		back.Tokens = -d
	}
	back.Output = max(r.Output-u.CompletionTokens, 0)
	extra.Output = max(u.CompletionTokens-r.Output, 0)
	if extra.Positive() {
		var slice int64
		if _, err := fmt.Sscanf(r.ID, "%d-", &slice); err == nil {
			s.charge(ctx, j.ID, key, slice, extra)
		}
	}
	if back.Tokens+back.Output >= minReturn && !r.SendAt.IsZero() {
		// The provider's bucket was charged the usage: pace what it was
		// charged (at the configured limits, never above the effective).
		// Coalesced per model: give-backs meanwhile join the next write.
		lim := budget.Limits{RPM: model.RPM, TPM: model.TokenLimit(), OTPM: model.OTPM}
		s.rewindBack(ctx, key, r.SendAt, back, lim)
	}
	s.recordPrefix(ctx, j, u)
	return true
}

// recordPrefix notes, for a request with a cache breakpoint, what the
// provider read from and wrote to its cache, and keeps the prefix warm in
// the fleet's registry when it did either.
func (s *Service) recordPrefix(ctx context.Context, j *task.Task, u job.Usage) {
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
