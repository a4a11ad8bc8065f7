package executor

import (
	"context"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// The executor settles and gives back reservations through the budget
// ledger (internal/budget: Ledger.Settle, Ledger.GiveBack), by its
// deployment's rule; it does none of the arithmetic.

// estimateClass is j's request shape class, when it names a valid one.
func estimateClass(j *task.Task) string {
	if tokens.ValidClass(j.Estimate.Class) {
		return j.Estimate.Class
	}
	return ""
}

// rule is the ledger's rule for j's deployment; a deployment no longer
// configured is settled by the one-token-limit rule (as it always was),
// and ok says it is gone.
func (s *feedback) rule(j *task.Task) (r budget.Rule, ok bool) {
	if _, model, ok := s.app().Deployment(j.Provider, j.Model); ok {
		return model.Rule(), true
	}
	return budget.Rule{}, false
}

// settleBudget settles j's reservation to the usage u the provider
// reported, and notes the prompt prefix it read or wrote (anthropic.go).
func (s *feedback) settleBudget(ctx context.Context, j *task.Task, u job.Usage) {
	r, _ := s.rule(j)
	s.ledger.Settle(ctx, r, j, u)
	if r.Split {
		s.recordPrefix(ctx, j, u)
	}
}

// giveBack returns what j's reservation held and the provider will not
// charge, for why.
func (s *feedback) giveBack(ctx context.Context, j *task.Task, why budget.Unspent) {
	r, ok := s.rule(j)
	if !ok && why == budget.Unsent {
		return // as before: a deployment gone keeps what it lapsed
	}
	s.ledger.GiveBack(ctx, r, j, why)
}
