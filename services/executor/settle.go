package executor

import (
	"context"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// reservedPrompt is the prompt tokens j's reservation holds: admission
// reserves the estimate corrected by what the fleet has learned
// (internal/calib), so the reservation, not the envelope's estimate, is
// what a provider's count settles against.
func reservedPrompt(j *task.Task) int {
	if r := j.Reservation; r != nil && r.Tokens >= j.Estimate.MaxTokens {
		return r.Tokens - j.Estimate.MaxTokens
	}
	return j.Estimate.PromptTokens
}

// estimateClass is j's request shape class, when it names a valid one.
func estimateClass(j *task.Task) string {
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
// what the provider's does). Coalesced per model (s.backs).
func (s *Service) returnOverReserved(ctx context.Context, j *task.Task, n int) {
	r := j.Reservation
	if r == nil || r.SendAt.IsZero() || n < minReturn {
		return
	}
	s.giveBack(ctx, budget.ModelKey(j.Provider, job.ModelToken(j.Model)), r.SendAt, budget.Cost{Tokens: n}, false)
}

// giveBack returns c at instant at to key's schedule (lapsed: as
// budget.ReturnLapsed), in one write with the give-backs of the same kind
// that arrive meanwhile.
func (s *Service) giveBack(ctx context.Context, key string, at time.Time, c budget.Cost, lapsed bool) {
	co := &s.backs
	if lapsed {
		co = &s.lapses
	}
	co.add(key, budget.Return{At: at, Cost: c}, func(key string, rs []budget.Return) {
		if err := s.store.ReturnAll(context.WithoutCancel(ctx), key, rs, lapsed); err != nil {
			s.log.Debug("give back to the schedule", "key", key, "returns", len(rs), "lapsed", lapsed, "err", err)
		}
	})
}

// rewindBack returns c at instant at to a bucket provider's schedule paced
// at lim (budget.ReturnRewindAll), coalesced per model.
func (s *Service) rewindBack(ctx context.Context, key string, at time.Time, c budget.Cost, lim budget.Limits) {
	s.refunds.add(key, rewound{Return: budget.Return{At: at, Cost: c}, lim: lim}, func(key string, items []rewound) {
		rs := make([]budget.Return, len(items))
		for i, x := range items {
			rs[i] = x.Return
		}
		// The latest limits (configured, never above the effective).
		if err := s.store.ReturnRewindAll(context.WithoutCancel(ctx), key, rs, items[len(items)-1].lim); err != nil {
			s.log.Debug("give back to a bucket's schedule", "key", key, "returns", len(rs), "err", err)
		}
	})
}

// rewound is a give-back to a bucket provider's schedule.
type rewound struct {
	budget.Return
	lim budget.Limits
}

// charge adds extra to the slice key's reservation was made in, coalesced
// per model.
func (s *Service) charge(ctx context.Context, jobID, key string, slice int64, extra budget.Cost) {
	s.charges.add(key, budget.Settlement{Slice: slice, Extra: extra}, func(key string, ss []budget.Settlement) {
		if err := s.store.SettleAll(context.WithoutCancel(ctx), key, ss); err != nil {
			s.log.Warn("settle: budget store", "job_id", jobID, "key", key, "settlements", len(ss), "err", err)
		}
	})
}

// coalesce makes one write of many per key: one goroutine writes a key at
// a time (the caller that found none writing), and what is added
// meanwhile joins its next write instead of being dropped or costing a
// compare-and-set of its own on the model's schedule, the key every
// admission process plans on. When executors fell behind (TestChaos, after
// executors were killed), every lapsed job returned its instant, each
// return a write, the conflicts slowed planning and the sends, more
// instants lapsed, and no job reached the provider for minutes.
type coalesce[T any] struct {
	mu      sync.Mutex
	pending map[string]*pending[T]
}

type pending[T any] struct {
	items   []T
	writing bool
}

// maxCoalesced bounds what waits per key; past it the oldest are dropped
// (give-backs err towards the limit; a charge that many behind is as
// stale as the window it was for).
const maxCoalesced = 4096

// add queues item for key, and writes it (with what joins) unless a write
// of key is under way.
func (c *coalesce[T]) add(key string, item T, write func(string, []T)) {
	c.mu.Lock()
	if c.pending == nil {
		c.pending = map[string]*pending[T]{}
	}
	p := c.pending[key]
	if p == nil {
		p = &pending[T]{}
		c.pending[key] = p
	}
	p.items = append(p.items, item)
	if len(p.items) > maxCoalesced {
		p.items = p.items[len(p.items)-maxCoalesced:]
	}
	if p.writing {
		c.mu.Unlock()
		return
	}
	p.writing = true
	// A few rounds at most, so a busy key does not keep one job's
	// goroutine writing: what is left joins the next one's write.
	for round := 0; len(p.items) > 0 && round < 3; round++ {
		batch := p.items
		p.items = nil
		c.mu.Unlock()
		write(key, batch)
		c.mu.Lock()
	}
	p.writing = false
	c.mu.Unlock()
}
