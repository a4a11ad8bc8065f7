package executor

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/route"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// verdict is what a provider call's outcome calls for.
type verdict int

const (
	// settleResult: the call succeeded; the budget settles and the result is
	// stored.
	settleResult verdict = iota
	// throttleJob: a rate-limit refusal of a call Sluice admitted; the job
	// goes back to admission and spends no attempt (throttled).
	throttleJob
	// endTooLarge: paid for, and too large to store: calling again would pay
	// again for an answer just as large, so the job ends failed.
	endTooLarge
	// endUnknown: the provider may have done (and billed) the work and may
	// not be called again: the job ends outcome_unknown.
	endUnknown
	// retryLater: the job goes back to admission after decision.delay.
	retryLater
	// endOrFallBack: no retry on this target: a route may name another
	// (decision.fallback), else the job ends with decision.status.
	endOrFallBack
)

// decision is what decide makes of an attempt's outcome; apply carries it
// out.
type decision struct {
	verdict verdict
	// rate: a 429 read by its headers and body; throttleJob's, and a quota
	// refusal's, whose Retry-After pauses the model all the same.
	rate *provider.RateLimitInfo
	// retryLater's wait. workDone: the provider may have done the work, so the
	// operation stays in flight and the retry reuses its key.
	delay    time.Duration
	workDone bool
	// endOrFallBack's: the situation to ask the job's route about (nil: no
	// fallback), then the terminal status, dead-letter reason and error.
	fallback *route.Situation
	status   job.Status
	reason   string // also endUnknown's: the outcome's code
	err      *job.Error
}

// outcome is a provider call's classified outcome and what decide needs
// around it.
type outcome struct {
	provider.Outcome
	header  http.Header // the response's (nil: none)
	attempt int         // the attempt's number
	first   time.Time   // when the job's first attempt started
	now     time.Time
}

// decide is what attempt o.attempt of j calls for, under the retry policy
// pol. mayCallAgain says whether a call whose outcome is unknown may be
// sent again (unknown.go). It has no effects: rnd, the backoff's jitter,
// is its only source of chance.
func decide(j *task.Task, o outcome, pol provider.Policy, mayCallAgain bool, rnd *rand.Rand) decision {
	var d decision
	if o.Class == provider.Retry && o.HTTPStatus == http.StatusTooManyRequests {
		info := provider.ClassifyRateLimit(o.Outcome, o.header, reservedCost(j), o.now)
		d.rate = &info
		if info.Kind != provider.LimitQuota {
			d.verdict = throttleJob
			return d
		}
	}
	switch {
	case o.Code == "body_too_large":
		d.verdict = endTooLarge
		return d
	case o.Class == provider.Success:
		d.verdict = settleResult
		return d
	}
	plan := provider.Plan(pol, o.Outcome, o.attempt, o.first, o.now, j.Deadline, rnd)
	d.workDone = o.OutcomeUnknown || o.WorkDone
	if d.workDone {
		// Unless the provider honours the Idempotency-Key (or the job
		// accepts paying twice), the job ends outcome_unknown; interactive
		// callers are told so at once in any case. Other classes wait
		// ReconcileDelay and retry with the same key, which the provider
		// answers from its record.
		if j.Priority == job.Interactive || !mayCallAgain {
			d.verdict, d.reason = endUnknown, o.Code
			return d
		}
		if o.attempt < pol.MaxAttempts {
			plan = provider.Plan(pol, provider.Outcome{Class: provider.Overloaded, Code: o.Code, RetryAfter: ReconcileDelay}, o.attempt, o.first, o.now, j.Deadline, rnd)
		}
	}
	if plan.Retry {
		d.verdict, d.delay = retryLater, plan.Delay
		return d
	}
	d.verdict = endOrFallBack
	if !d.workDone {
		d.fallback = &route.Situation{Current: config.Target{Provider: j.Provider, Model: j.Model}, Priority: string(j.Priority),
			LastClass: o.Class, RetryBudgetExhausted: plan.Reason != provider.ReasonNotRetryable}
	}
	d.err = o.JobError()
	d.status, d.reason = job.StatusFailed, o.Class.String()
	if plan.Reason != provider.ReasonNotRetryable && plan.Reason != "" {
		d.status, d.reason = job.StatusDeadLettered, plan.Reason
		d.err = &job.Error{Code: job.CodeRetriesExceeded, Message: fmt.Sprintf("%s after %d attempts; last error %s: %s", plan.Reason, o.attempt, d.err.Code, d.err.Message), RetryAfterMS: d.err.RetryAfterMS}
	}
	return d
}

// reservedCost is what a 429 of j refused, as provider.ClassifyRateLimit
// weighs it: the reservation's input and output apart when it has them,
// else the estimate.
func reservedCost(j *task.Task) provider.Cost {
	cost := provider.Cost{Requests: 1}
	if j.Estimate != nil {
		cost.Tokens = j.Estimate.Cost()
	}
	if r := j.Reservation; r != nil && r.Output > 0 {
		cost.Tokens, cost.Output = r.Tokens, r.Output
	}
	return cost
}
