package provider

import (
	"math/rand/v2"
	"time"
)

// maxBackoff bounds the backoff ceiling when no MaxDelay is set.
const maxBackoff = maxHint

// Backoff is exponential backoff with full jitter: a delay drawn uniformly
// from [0, min(max, base*2^(attempt-1))], then raised to retryAfter if below
// it (a provider's Retry-After is never cut short). attempt counts from 1
// (the attempt that just failed); max <= 0 means no cap. rnd may be nil (the
// global source is used then).
func Backoff(attempt int, base, max time.Duration, retryAfter time.Duration, rnd *rand.Rand) time.Duration {
	ceiling := maxBackoff
	if max > 0 {
		ceiling = min(max, maxBackoff)
	}
	return jitter(attempt, base, ceiling, retryAfter, rnd)
}

// jitter is Backoff with an explicit ceiling (which may be 0).
func jitter(attempt int, base, ceiling, retryAfter time.Duration, rnd *rand.Rand) time.Duration {
	attempt = max(attempt, 1)
	c := max(base, 0)
	for i := 1; i < attempt && c > 0 && c < ceiling; i++ {
		c *= 2
	}
	c = max(min(c, ceiling), 0)
	var d time.Duration
	if c > 0 {
		if rnd != nil {
			d = time.Duration(rnd.Int64N(int64(c) + 1))
		} else {
			d = time.Duration(rand.Int64N(int64(c) + 1))
		}
	}
	return max(d, retryAfter)
}

// Policy bounds retries of one job.
type Policy struct {
	// MaxAttempts is the most provider calls per job, first included. Values
	// below 1 mean 1: no retries.
	MaxAttempts int
	// MaxElapsed bounds the time from the first attempt to the start of the
	// last one; 0 = no bound (the deadline still applies).
	MaxElapsed time.Duration
	// BaseDelay and MaxDelay shape the backoff; MaxDelay <= 0 = no cap.
	BaseDelay, MaxDelay time.Duration
}

// Decision is Plan's answer.
type Decision struct {
	Retry bool
	Delay time.Duration
	// Reason, when not retrying: "not_retryable", "outcome_unknown",
	// "attempts_exhausted", "deadline_would_pass", "elapsed_budget_exhausted".
	// When retrying it is the class name ("rate_limited", "overloaded",
	// "connect").
	Reason string
}

// Reasons Plan gives.
const (
	ReasonNotRetryable    = "not_retryable"
	ReasonOutcomeUnknown  = "outcome_unknown"
	ReasonAttempts        = "attempts_exhausted"
	ReasonDeadline        = "deadline_would_pass"
	ReasonElapsedExceeded = "elapsed_budget_exhausted"
)

// Plan decides whether and when to retry after attempt number attempt
// (counting from 1) ended with o.
//
// Only Retry, Overloaded and ConnectFailed outcomes are retried; Unknown
// gives Reason "outcome_unknown" and the caller applies its reconciliation
// policy. The delay is Backoff with its ceiling also bounded by the time left
// before the deadline and before firstAttemptAt+MaxElapsed, so a retry that
// fits is never given up by an unlucky jitter draw, and the delay never
// passes either bound. The delay is never shorter than o.RetryAfter: when
// Retry-After itself does not fit, Plan gives up ("deadline_would_pass" or
// "elapsed_budget_exhausted") rather than cut it short.
func Plan(p Policy, o Outcome, attempt int, firstAttemptAt, now time.Time, deadline *time.Time, rnd *rand.Rand) Decision {
	switch {
	case o.Class == Unknown:
		return Decision{Reason: ReasonOutcomeUnknown}
	case !o.Class.Retryable():
		return Decision{Reason: ReasonNotRetryable}
	case attempt >= max(p.MaxAttempts, 1):
		return Decision{Reason: ReasonAttempts}
	}
	ceiling := maxBackoff
	if p.MaxDelay > 0 {
		ceiling = min(p.MaxDelay, maxBackoff)
	}
	if deadline != nil {
		left := deadline.Sub(now)
		if left <= 0 || o.RetryAfter > left {
			return Decision{Reason: ReasonDeadline}
		}
		ceiling = min(ceiling, left)
	}
	if p.MaxElapsed > 0 {
		left := firstAttemptAt.Add(p.MaxElapsed).Sub(now)
		if left <= 0 || o.RetryAfter > left {
			return Decision{Reason: ReasonElapsedExceeded}
		}
		ceiling = min(ceiling, left)
	}
	d := jitter(attempt, p.BaseDelay, ceiling, o.RetryAfter, rnd)
	// Defensive: jitter stays within ceiling and RetryAfter was checked.
	if deadline != nil && now.Add(d).After(*deadline) {
		return Decision{Reason: ReasonDeadline}
	}
	if p.MaxElapsed > 0 && now.Add(d).After(firstAttemptAt.Add(p.MaxElapsed)) {
		return Decision{Reason: ReasonElapsedExceeded}
	}
	return Decision{Retry: true, Delay: d, Reason: o.Class.String()}
}
