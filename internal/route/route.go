// Package route decides where a job goes when its target fails: to a
// fallback, to the route's degrade_to target, or nowhere (the retry policy
// or a terminal failure takes over).
//
// Routes are configured as config.Route (the "routes" key). A Router picks
// the route for a job with [Router.RouteFor]; after each attempt that did not
// succeed, the executor describes what happened as a [Situation] and asks
// [Router.Next]. It does no I/O and keeps no state beyond the routes, so it
// is safe for concurrent use.
//
// # Conditions
//
// A fallback or degrade_to target is taken when one of its "when" conditions
// holds for the current target (the one the job last ran on):
//
//   - provider_5xx: the last attempt was classified provider.Overloaded
//     (5xx, 529, 408) or provider.ConnectFailed, and the retry policy gave
//     up (RetryBudgetExhausted). A single 5xx is retried on the same target
//     first: overload is usually brief, and moving costs a different price
//     and a cold cache. An unreachable provider is a failing provider too,
//     and a connect failure certainly never reached it.
//   - rate_limit_after_retry_budget: the last attempt was a 429 rate limit
//     (provider.Retry) and the retry policy gave up.
//   - primary_unavailable: the target cannot serve anyone: its breaker is
//     open, its credential is marked broken, or the last attempt was a
//     401/403 (provider.AuthBroken) or a quota or billing refusal
//     (provider.OperatorAction). Those fail on that account for every
//     request, so another provider is the only way to serve the job.
//   - batch_low_priority: the job is batch priority and the target is
//     throttling: the last attempt was a 429 or its breaker is open. Meant
//     for degrade_to: batch work moves to a cheaper or batch model at the
//     first sign of pressure rather than waiting on the busy one.
//
// # Never
//
// Next never moves a job whose last attempt's outcome is unknown and not
// reconciled (Situation.OutcomeUnknown): the provider may have done, and
// billed, the work, and a second provider would do it again. It never moves
// a job whose request was wrong (provider.Fail: 400, context length, policy):
// it is wrong everywhere. It never moves a job back to a target it already
// tried, nor to the current target.
package route

import (
	"slices"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Situation is what the executor knows after an attempt (or before the
// first, to route around an open breaker).
type Situation struct {
	// Current is where the job last ran, or was about to run.
	Current config.Target
	// Priority is the job's class: interactive, standard or batch.
	Priority string
	// LastClass classifies the last attempt on Current; provider.Unknown
	// when there was none (OutcomeUnknown false).
	LastClass provider.Class
	// RetryBudgetExhausted: the retry policy just gave up on Current.
	RetryBudgetExhausted bool
	// OutcomeUnknown: the last attempt's outcome is unknown and not
	// reconciled (no headers before a timeout, body cut).
	OutcomeUnknown bool
	// BreakerOpen reports whether a target's circuit breaker refuses calls;
	// nil means no breaker is open.
	BreakerOpen func(t config.Target) bool
	// CredentialBroken reports whether a target's credential is marked
	// broken (a 401/403); nil means none is.
	CredentialBroken func(t config.Target) bool
	// Tried lists the targets already attempted for this job.
	Tried []config.Target
}

func (s Situation) breakerOpen(t config.Target) bool {
	return s.BreakerOpen != nil && s.BreakerOpen(t)
}

func (s Situation) credentialBroken(t config.Target) bool {
	return s.CredentialBroken != nil && s.CredentialBroken(t)
}

// holds reports whether a condition holds for s.Current.
func (s Situation) holds(cond string) bool {
	switch cond {
	case config.CondProvider5xx:
		return (s.LastClass == provider.Overloaded || s.LastClass == provider.ConnectFailed) && s.RetryBudgetExhausted
	case config.CondRateLimitAfterRetryBudget:
		return s.LastClass == provider.Retry && s.RetryBudgetExhausted
	case config.CondPrimaryUnavailable:
		return s.LastClass == provider.AuthBroken || s.LastClass == provider.OperatorAction ||
			s.breakerOpen(s.Current) || s.credentialBroken(s.Current)
	case config.CondBatchLowPriority:
		return s.Priority == string(job.Batch) && (s.LastClass == provider.Retry || s.breakerOpen(s.Current))
	}
	return false
}

// usable reports whether the job may move to t.
func (s Situation) usable(t config.Target) bool {
	return t != s.Current && !slices.Contains(s.Tried, t) && !s.breakerOpen(t) && !s.credentialBroken(t)
}

// Decision is where to send the job next.
type Decision struct {
	Target config.Target
	// Reason is the condition that matched (one of config.Conditions), for
	// logs and the reason metric label.
	Reason string
	// Degrade: Target is the route's degrade_to, not a fallback.
	Degrade bool
}

// Router holds the configured routes.
type Router struct {
	routes  []config.Route
	byTask  map[string]int // task → index in routes
	byModel map[string]int // primary model of a default route → index
}

// New returns a router over a copy of routes, which should have passed
// config.ValidateRoutes; where two routes claim the same task or model, the
// first wins.
func New(routes []config.Route) *Router {
	r := &Router{routes: make([]config.Route, len(routes)), byTask: map[string]int{}, byModel: map[string]int{}}
	for i, rt := range routes {
		rt.Fallbacks = slices.Clone(rt.Fallbacks)
		for j := range rt.Fallbacks {
			rt.Fallbacks[j].When = slices.Clone(rt.Fallbacks[j].When)
		}
		if rt.DegradeTo != nil {
			d := *rt.DegradeTo
			d.When = slices.Clone(d.When)
			rt.DegradeTo = &d
		}
		r.routes[i] = rt
		idx, key := r.byTask, rt.Task
		if rt.IsDefault() {
			idx, key = r.byModel, rt.Primary.Model
		}
		if _, ok := idx[key]; !ok {
			idx[key] = i
		}
	}
	return r
}

// RouteFor returns the route for a job: the route naming its task, else the
// default route (task empty or "*") whose primary is its model. A route for
// a task applies whatever model the job names; a route for a task never
// serves jobs of another task or of none. The route belongs to the Router:
// do not modify it.
func (r *Router) RouteFor(task, model string) (*config.Route, bool) {
	if task != "" && task != "*" {
		if i, ok := r.byTask[task]; ok {
			return &r.routes[i], true
		}
	}
	if i, ok := r.byModel[model]; ok {
		return &r.routes[i], true
	}
	return nil, false
}

// Next decides whether the job described by s moves, and where. It returns
// false when the job stays: no condition holds, the outcome is unknown, the
// request was wrong, or every target whose conditions hold was tried, has
// its breaker open or its credential broken.
//
// Fallbacks are considered in their configured order. A batch job considers
// the route's degrade_to before them (low-priority work should not take the
// fallback's capacity from interactive work); other jobs consider it after
// them. When several conditions hold, Reason is the first in
// config.Conditions order that the target lists.
func (r *Router) Next(route *config.Route, s Situation) (Decision, bool) {
	if route == nil || s.OutcomeUnknown {
		return Decision{}, false
	}
	switch s.LastClass {
	case provider.Fail, provider.Success:
		return Decision{}, false
	}
	var held []string
	for _, c := range config.Conditions {
		if s.holds(c) {
			held = append(held, c)
		}
	}
	if len(held) == 0 {
		return Decision{}, false
	}
	reason := func(when []string) string {
		if len(when) == 0 {
			when = config.DefaultWhen
		}
		for _, c := range held {
			if slices.Contains(when, c) {
				return c
			}
		}
		return ""
	}
	degrade := func() (Decision, bool) {
		d := route.DegradeTo
		if d == nil || len(d.When) == 0 || !s.usable(d.Target) {
			return Decision{}, false
		}
		if why := reason(d.When); why != "" {
			return Decision{Target: d.Target, Reason: why, Degrade: true}, true
		}
		return Decision{}, false
	}
	batch := s.Priority == string(job.Batch)
	if batch {
		if d, ok := degrade(); ok {
			return d, true
		}
	}
	for _, f := range route.Fallbacks {
		if !s.usable(f.Target) {
			continue
		}
		if why := reason(f.When); why != "" {
			return Decision{Target: f.Target, Reason: why}, true
		}
	}
	if !batch {
		return degrade()
	}
	return Decision{}, false
}
