package executor

import (
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	pol := provider.Policy{MaxAttempts: 3, MaxElapsed: 10 * time.Minute, BaseDelay: 100 * time.Millisecond, MaxDelay: 30 * time.Second}
	passed := now.Add(-time.Second)
	overloaded := provider.Outcome{Class: provider.Overloaded, Code: "overloaded_error", HTTPStatus: 503}
	noAnswer := provider.Outcome{Class: provider.Unknown, Code: "header_timeout", OutcomeUnknown: true}
	cutBody := provider.Outcome{Class: provider.Overloaded, Code: "connection_reset", WorkDone: true}
	minute429 := provider.Outcome{Class: provider.Retry, Code: "rate_limit_exceeded", HTTPStatus: 429, LimitType: "tokens"}
	spent := http.Header{"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Limit-Tokens": {"1000"}}
	day429 := provider.Outcome{Class: provider.Retry, Code: "rate_limit_exceeded", HTTPStatus: 429, RetryAfter: 2 * time.Second,
		Quota: "GenerateRequestsPerDayPerProjectPerModel-FreeTier", Message: "Quota exceeded for requests per day"}
	tests := []struct {
		name         string
		out          provider.Outcome
		header       http.Header
		attempt      int
		priority     job.Priority
		deadline     *time.Time
		mayCallAgain bool

		want         verdict
		wantStatus   job.Status // endOrFallBack
		wantReason   string     // endOrFallBack, endUnknown
		wantCode     string     // endOrFallBack: the error's code
		wantFallback bool       // endOrFallBack: a route is asked
		wantRate     provider.RateLimitKind
		wantMinDelay time.Duration // retryLater
		wantWorkDone bool
	}{
		{name: "success settles", out: provider.Outcome{Class: provider.Success, HTTPStatus: 200}, attempt: 1, want: settleResult},
		{name: "a 429 of a minute throttles, spending no attempt", out: minute429, header: spent, attempt: 3,
			want: throttleJob, wantRate: provider.LimitMinute},
		{name: "a quota 429 is no throttle: the policy retries it", out: day429, attempt: 1,
			want: retryLater, wantRate: provider.LimitQuota, wantMinDelay: 2 * time.Second},
		{name: "an answer too large to store ends the job", out: provider.Outcome{Class: provider.Overloaded, Code: "body_too_large", WorkDone: true}, attempt: 1,
			mayCallAgain: true, want: endTooLarge},
		{name: "overloaded retries", out: overloaded, attempt: 1, want: retryLater, wantMinDelay: time.Nanosecond},
		{name: "overloaded on the last attempt dead-letters, a route asked first", out: overloaded, attempt: 3,
			want: endOrFallBack, wantStatus: job.StatusDeadLettered, wantReason: provider.ReasonAttempts, wantCode: job.CodeRetriesExceeded, wantFallback: true},
		{name: "past the deadline dead-letters", out: overloaded, attempt: 1, deadline: &passed,
			want: endOrFallBack, wantStatus: job.StatusDeadLettered, wantReason: provider.ReasonDeadline, wantCode: job.CodeRetriesExceeded, wantFallback: true},
		{name: "a bad request fails at once, a route asked first", out: provider.Outcome{Class: provider.Fail, Code: "invalid_request_error", HTTPStatus: 400}, attempt: 1,
			want: endOrFallBack, wantStatus: job.StatusFailed, wantReason: provider.Fail.String(), wantCode: "invalid_request_error", wantFallback: true},
		{name: "no answer and no idempotency: outcome unknown", out: noAnswer, attempt: 1, priority: job.Batch,
			want: endUnknown, wantReason: "header_timeout", wantWorkDone: true},
		{name: "no answer, interactive: outcome unknown even when it may call again", out: noAnswer, attempt: 1, priority: job.Interactive, mayCallAgain: true,
			want: endUnknown, wantReason: "header_timeout", wantWorkDone: true},
		{name: "work done, may call again: retry with the same key after the reconcile delay", out: cutBody, attempt: 1, priority: job.Batch, mayCallAgain: true,
			want: retryLater, wantMinDelay: ReconcileDelay, wantWorkDone: true},
		{name: "no answer on the last attempt ends with no fallback", out: noAnswer, attempt: 3, priority: job.Batch, mayCallAgain: true,
			want: endOrFallBack, wantStatus: job.StatusDeadLettered, wantReason: provider.ReasonOutcomeUnknown, wantCode: job.CodeRetriesExceeded, wantWorkDone: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			j := &task.Task{
				Job:      job.Job{ID: "j", Provider: "p", Priority: tt.priority, Deadline: tt.deadline},
				Model:    "m",
				Estimate: &job.Estimate{PromptTokens: 100, MaxTokens: 50},
			}
			if j.Priority == "" {
				j.Priority = job.Standard
			}
			o := outcome{Outcome: tt.out, header: tt.header, attempt: tt.attempt, first: now.Add(-time.Minute), now: now}
			d := decide(j, o, pol, tt.mayCallAgain, rand.New(rand.NewPCG(1, 2)))
			if d.verdict != tt.want {
				t.Fatalf("verdict %d, want %d (decision %+v)", d.verdict, tt.want, d)
			}
			if got := d.rate != nil; got != (tt.wantRate != "") {
				t.Fatalf("rate read %v, want %v", got, tt.wantRate != "")
			}
			if d.rate != nil && d.rate.Kind != tt.wantRate {
				t.Errorf("rate kind %q, want %q", d.rate.Kind, tt.wantRate)
			}
			if d.workDone != tt.wantWorkDone {
				t.Errorf("workDone %v, want %v", d.workDone, tt.wantWorkDone)
			}
			switch d.verdict {
			case retryLater:
				if d.delay < tt.wantMinDelay {
					t.Errorf("delay %v, want at least %v", d.delay, tt.wantMinDelay)
				}
			case endUnknown:
				if d.reason != tt.wantReason {
					t.Errorf("reason %q, want %q", d.reason, tt.wantReason)
				}
			case endOrFallBack:
				if d.status != tt.wantStatus || d.reason != tt.wantReason || d.err == nil || d.err.Code != tt.wantCode {
					t.Errorf("ends %s (%s, %+v), want %s (%s, code %s)", d.status, d.reason, d.err, tt.wantStatus, tt.wantReason, tt.wantCode)
				}
				if got := d.fallback != nil; got != tt.wantFallback {
					t.Fatalf("fallback asked %v, want %v", got, tt.wantFallback)
				}
				if f := d.fallback; f != nil && (f.Current.Provider != "p" || f.Current.Model != "m" || f.LastClass != tt.out.Class ||
					f.RetryBudgetExhausted != (tt.wantStatus == job.StatusDeadLettered)) {
					t.Errorf("fallback situation %+v: want current p/m, last class %s, budget exhausted %v", f, tt.out.Class, tt.wantStatus == job.StatusDeadLettered)
				}
			}
		})
	}
}

func TestReservedCost(t *testing.T) {
	t.Parallel()
	j := &task.Task{Estimate: &job.Estimate{PromptTokens: 100, MaxTokens: 50}}
	if got, want := reservedCost(j), (provider.Cost{Requests: 1, Tokens: 150}); got != want {
		t.Errorf("by the estimate: %+v, want %+v", got, want)
	}
	j.Reservation = &task.Reservation{Tokens: 80, Output: 50}
	if got, want := reservedCost(j), (provider.Cost{Requests: 1, Tokens: 80, Output: 50}); got != want {
		t.Errorf("a split reservation: %+v, want %+v", got, want)
	}
}
