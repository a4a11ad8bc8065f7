package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Fallback conditions: the names a route's "when" lists may use. Each is also
// the value of the reason label on fallback metrics, so the names are a
// contract. internal/route decides when each one holds.
const (
	// CondProvider5xx: the last attempt on the current target was
	// classified overloaded (5xx, 529, 408) or could not connect, and the
	// retry policy gave up on it.
	CondProvider5xx = "provider_5xx"
	// CondRateLimitAfterRetryBudget: the current target kept answering 429
	// rate limits until the retry policy gave up.
	CondRateLimitAfterRetryBudget = "rate_limit_after_retry_budget"
	// CondPrimaryUnavailable: the current target cannot serve anyone: its
	// circuit breaker is open, its credential is broken (401/403), or its
	// account is out of quota or billing.
	CondPrimaryUnavailable = "primary_unavailable"
	// CondBatchLowPriority: a batch job whose current target is throttling
	// (a 429, or its breaker is open).
	CondBatchLowPriority = "batch_low_priority"
)

// Conditions lists every fallback condition, in the order internal/route prefers
// them when more than one holds (the most specific cause first).
var Conditions = []string{CondProvider5xx, CondRateLimitAfterRetryBudget, CondPrimaryUnavailable, CondBatchLowPriority}

// DefaultWhen is what a fallback without a "when" list falls back on: every
// failure of the target, but not mere batch throttling (that is what
// degrade_to is for).
var DefaultWhen = []string{CondProvider5xx, CondRateLimitAfterRetryBudget, CondPrimaryUnavailable}

// Target is one provider/model pair.
type Target struct {
	Provider string `yaml:"provider"`
	Model    string `yaml:"model"`
}

// String returns "provider/model", the key circuit breakers and metrics use.
func (t Target) String() string { return t.Provider + "/" + t.Model }

// Fallback is a target and the conditions under which a job moves to it.
type Fallback struct {
	Target `yaml:",inline"`
	// When lists conditions (see Conditions); any one of them is enough.
	// Empty on a fallback means DefaultWhen; degrade_to requires it.
	When []string `yaml:"when"`
}

// Route is one routing policy: where a task (or a model) runs first and where
// its jobs may go when that target fails.
//
//	routes:
//	  - task: summarize
//	    primary: {provider: openai, model: gpt-4o-mini}
//	    fallbacks:
//	      - {provider: anthropic, model: claude-haiku-4-5, when: [provider_5xx, primary_unavailable]}
//	    degrade_to: {provider: openai, model: gpt-4o-mini-batch, when: [batch_low_priority]}
type Route struct {
	// Task is the job's task name this route serves. Empty or "*" makes the
	// route the default for jobs whose model is the primary's model.
	Task      string     `yaml:"task"`
	Primary   Target     `yaml:"primary"`
	Fallbacks []Fallback `yaml:"fallbacks"`
	// DegradeTo is where low-priority work goes, typically a cheaper or
	// batch model, under its own conditions.
	DegradeTo *Fallback `yaml:"degrade_to"`
}

// IsDefault reports whether the route serves any job whose model is the
// primary's rather than one task.
func (r Route) IsDefault() bool { return r.Task == "" || r.Task == "*" }

// ValidateRoutes reports the first problem in routes, naming its key path
// ("routes[0].fallbacks[1].when[0]: ..."). hasModel reports whether a
// provider serves a model; nil skips that check.
func ValidateRoutes(routes []Route, hasModel func(provider, model string) bool) error {
	fail := func(key, format string, args ...any) error {
		return fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...))
	}
	target := func(key string, t Target) error {
		if t.Provider == "" {
			return fail(key+".provider", "is required")
		}
		if t.Model == "" {
			return fail(key+".model", "is required")
		}
		if hasModel != nil && !hasModel(t.Provider, t.Model) {
			return fail(key, "unknown provider/model pair %q: no provider %q serving model %q under providers; add the model to that provider, or route to one that is there", t.String(), t.Provider, t.Model)
		}
		return nil
	}
	when := func(key string, conds []string) error {
		for i, c := range conds {
			k := fmt.Sprintf("%s[%d]", key, i)
			if !slices.Contains(Conditions, c) {
				return fail(k, "unknown condition %q (want one of %s)", c, strings.Join(Conditions, ", "))
			}
			if j := slices.Index(conds, c); j < i {
				return fail(k, "%q repeats %s[%d]", c, key, j)
			}
		}
		return nil
	}
	tasks := map[string]int{}    // task → route index
	defaults := map[string]int{} // primary model of a default route → route index
	for i, r := range routes {
		key := fmt.Sprintf("routes[%d]", i)
		if !r.IsDefault() {
			if !job.ValidName(r.Task) {
				return fail(key+".task", "%q must be 1-64 letters, digits, '-' or '_' (or \"*\" or empty for a model's default route)", r.Task)
			}
			if j, ok := tasks[r.Task]; ok {
				return fail(key+".task", "duplicate task %q (already routed by routes[%d])", r.Task, j)
			}
			tasks[r.Task] = i
		}
		if err := target(key+".primary", r.Primary); err != nil {
			return err
		}
		if r.IsDefault() {
			if j, ok := defaults[r.Primary.Model]; ok {
				return fail(key+".primary", "routes[%d] is already the default route for model %q; give one of them a task", j, r.Primary.Model)
			}
			defaults[r.Primary.Model] = i
		}
		for j, f := range r.Fallbacks {
			fk := fmt.Sprintf("%s.fallbacks[%d]", key, j)
			if err := target(fk, f.Target); err != nil {
				return err
			}
			if f.Target == r.Primary {
				return fail(fk, "%q is the primary; a fallback must be another target", f.Target.String())
			}
			for k := range j {
				if r.Fallbacks[k].Target == f.Target {
					return fail(fk, "%q repeats %s.fallbacks[%d]", f.Target.String(), key, k)
				}
			}
			if err := when(fk+".when", f.When); err != nil {
				return err
			}
		}
		if d := r.DegradeTo; d != nil {
			dk := key + ".degrade_to"
			if err := target(dk, d.Target); err != nil {
				return err
			}
			if d.Target == r.Primary {
				return fail(dk, "%q is the primary; degrade_to must be another target", d.Target.String())
			}
			if len(d.When) == 0 {
				return fail(dk+".when", "is required (say when to degrade, e.g. [%s])", CondBatchLowPriority)
			}
			if err := when(dk+".when", d.When); err != nil {
				return err
			}
		}
	}
	return nil
}
