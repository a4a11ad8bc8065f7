package executor

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

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

// returns coalesces give-backs to a bucket provider's schedule (settleSplit):
// per model key, one goroutine writes at a time, and what is given back
// meanwhile joins its next write (budget.ReturnRewindAll), so none is
// dropped (each used to be skipped while another was under way, leaving
// its tokens spent) and the writes stay one at a time per key.
type returns struct {
	mu      sync.Mutex
	pending map[string]*pendingReturns
}

type pendingReturns struct {
	rs      []budget.Return
	lim     budget.Limits
	writing bool
}

// maxPendingReturns bounds what waits per key; past it the oldest are
// dropped (they err towards the limit).
const maxPendingReturns = 4096

// add gives c back at instant at on key's schedule paced at lim, now or
// with the write under way's successor; write does the writing.
func (r *returns) add(key string, at time.Time, c budget.Cost, lim budget.Limits, write func(string, []budget.Return, budget.Limits)) {
	r.mu.Lock()
	if r.pending == nil {
		r.pending = map[string]*pendingReturns{}
	}
	p := r.pending[key]
	if p == nil {
		p = &pendingReturns{}
		r.pending[key] = p
	}
	p.rs = append(p.rs, budget.Return{At: at, Cost: c})
	if len(p.rs) > maxPendingReturns {
		p.rs = p.rs[len(p.rs)-maxPendingReturns:]
	}
	p.lim = lim
	if p.writing {
		r.mu.Unlock()
		return
	}
	p.writing = true
	// A few rounds at most, so a busy key does not keep one job's
	// goroutine writing: what is left joins the next give-back's write.
	for round := 0; len(p.rs) > 0 && round < 3; round++ {
		batch, lim := p.rs, p.lim
		p.rs = nil
		r.mu.Unlock()
		write(key, batch, lim)
		r.mu.Lock()
	}
	p.writing = false
	r.mu.Unlock()
}
