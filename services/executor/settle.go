package executor

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/tokens"
	"github.com/sluice-dev/sluice/pkg/job"
)

// reservedPrompt is the prompt tokens j's reservation holds: admission
// reserves the estimate corrected by what the fleet has learned
// (internal/calib), so the reservation, not the envelope's estimate, is
// what a provider's count settles against.
func reservedPrompt(j *job.Job) int {
	if r := j.Reservation; r != nil && r.Tokens >= j.Estimate.MaxTokens {
		return r.Tokens - j.Estimate.MaxTokens
	}
	return j.Estimate.PromptTokens
}

// estimateClass is j's request shape class, when it names a valid one.
func estimateClass(j *job.Job) string {
	if tokens.ValidClass(j.Estimate.Class) {
		return j.Estimate.Class
	}
	return ""
}

// minReturn is the least over-reservation worth a compare-and-set on the
// model's schedule: smaller ones are left spent (they err towards the
// limit).
const minReturn = 16

// returnOverReserved gives back to the window, at the call's instant, the
// prompt tokens a paced reservation held beyond what the provider counted
// (it charges what it counted, as Sluice reserved: the window then holds
// what the provider's does). One at a time per model, as giveBackUnsent.
func (s *Service) returnOverReserved(ctx context.Context, j *job.Job, n int) {
	r := j.Reservation
	if r == nil || r.SendAt.IsZero() || n < minReturn {
		return
	}
	key := budget.ModelKey(j.Provider, job.ModelToken(j.Model))
	s.returning.try(key, func() {
		if err := s.store.ReturnAt(context.WithoutCancel(ctx), key, r.SendAt, budget.Cost{Tokens: n}); err != nil {
			s.log.Debug("return over-reserved prompt tokens", "job_id", j.ID, "err", err)
		}
	})
}

// perKey runs one function at a time per key: a call that finds one
// running for its key is skipped.
type perKey struct{ m sync.Map }

func (p *perKey) try(key string, f func()) {
	v, _ := p.m.LoadOrStore(key, new(atomic.Bool))
	busy := v.(*atomic.Bool)
	if !busy.CompareAndSwap(false, true) {
		return
	}
	defer busy.Store(false)
	f()
}
