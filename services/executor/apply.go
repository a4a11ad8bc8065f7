package executor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/route"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// outcomes owns the course a call's outcome takes: classified, decided
// (decide.go) and applied: the result, a retry, a 429's requeue, a
// fallback or the job's end.
type outcomes struct {
	*env
	fin   *finisher
	back  *requeuer
	marks *marks
	str   *streamer
	fb    *feedback
	deps  *deployments
	fall  *fallbacks
	rndMu sync.Mutex
	rnd   *rand.Rand
}

// conclude settles what a call's outcome calls for: a call that did not
// leave goes back to admission, a stream past its first token ends as it
// ended, and any other outcome is classified, decided and applied.
func (s *outcomes) conclude(ctx context.Context, a *attempt) error {
	j := a.j
	if errors.Is(a.cerr, provider.ErrSendLate) {
		// Not sent: the connection came (or the request was built) after
		// the instant it had to leave by.
		return s.back.notSent(ctx, a)
	}
	s.m.ProviderLatency.WithLabelValues(j.Provider, j.Model).Observe(a.elapsed.Seconds())
	j.Gated = false // sent: another attempt pays the tenant and day budgets again
	if a.end != nil {
		return s.endStreamed(ctx, a)
	}
	out := provider.Classify(a.resp, a.cerr, s.now())
	status := out.Code
	if out.HTTPStatus != 0 {
		status = fmt.Sprint(out.HTTPStatus)
	}
	s.countRequest(j, status)
	switch out.Class {
	case provider.Success:
		a.ticket.Record(true)
		s.deps.deploymentUp(ctx, a)
	case provider.Overloaded, provider.ConnectFailed, provider.Unknown:
		a.ticket.Record(false)
	default:
		a.ticket.Release() // 429s and request errors say nothing about the provider's health
	}
	if reason := downReason(out); reason != "" {
		s.deps.deploymentDown(ctx, j, reason, time.Time{})
		if s.deps.grouped(j) {
			return s.deps.replace(ctx, a, reason)
		}
	}
	o := outcome{Outcome: out, attempt: a.n, first: a.start.UTC(), now: s.now()}
	if len(j.Attempts) > 0 {
		o.first = j.Attempts[0].StartedAt
	}
	if a.resp != nil {
		o.header = a.resp.Header
	}
	pol := s.app().Policy(j.Priority)
	policy := provider.Policy{MaxAttempts: pol.MaxAttempts, MaxElapsed: pol.MaxElapsed.D(), BaseDelay: pol.BaseDelay.D(), MaxDelay: pol.MaxDelay.D()}
	s.rndMu.Lock()
	d := decide(j, o, policy, s.marks.mayCallAgain(j), s.rnd)
	s.rndMu.Unlock()
	if oe := operatorError(j, out); oe != nil {
		d = operatorEnd(j, out, d, oe) // health.go
	}
	return s.apply(ctx, a, out, d)
}

// apply carries out decision d on the outcome out of attempt a.
func (s *outcomes) apply(ctx context.Context, a *attempt, out provider.Outcome, d decision) error {
	j := a.j
	if d.rate != nil {
		if d.rate.RetryAfter > 0 {
			// The provider asked to wait (in its headers, or in its body as
			// Gemini does): the whole fleet waits, instead of every executor
			// finding out with a 429 of its own.
			s.deps.coolDeployment(ctx, j, s.now().Add(d.rate.RetryAfter))
		}
		if d.verdict == throttleJob {
			s.rateLimitHit(j, d.rate.Dimension, d.rate.Kind)
			return s.throttled(ctx, a.msg, j, a.opKey, *d.rate, a.start, a.elapsed)
		}
		s.rateLimitHit(j, out.LimitType, provider.LimitQuota)
	}
	attemptErr := out.JobError()
	if oe := operatorError(j, out); oe != nil {
		attemptErr = oe // the caller reads attempts too: no endpoint address
	}
	j.Attempts = append(j.Attempts, job.Attempt{N: a.n, Provider: j.Provider, Model: j.Model, StartedAt: a.start.UTC(),
		DurationMS: a.elapsed.Milliseconds(), Status: out.HTTPStatus, Outcome: out.Class.String(), Error: attemptErr})
	if a.resp != nil {
		s.fb.seed(ctx, j, a.resp.RateLimit)
	}
	switch d.verdict {
	case endTooLarge:
		// The job's budget stays charged at the reservation.
		return s.fin.finish(ctx, j, a.opKey, &mesh.Outcome{Status: job.StatusFailed, Error: s.fin.tooLarge()})
	case settleResult:
		s.fb.settle(ctx, j, a.resp.Usage)
		var inFlight *mesh.OpRecord
		if a.opRev > 0 {
			inFlight = a.op
		}
		return s.fin.finishHinted(ctx, j, a.opKey, &mesh.Outcome{Status: job.StatusSucceeded, Response: a.resp.Body, Usage: &a.resp.Usage,
			ProviderRequestID: provider.RequestID(a.resp.Header)}, inFlight, a.opRev)
	case endUnknown:
		return s.marks.outcomeUnknown(ctx, j, a.opKey, d.reason)
	case retryLater:
		s.m.Retries.WithLabelValues(j.Provider, j.Model, out.Class.String()).Inc()
		nb := s.now().Add(d.delay).UTC()
		j.NotBefore, j.Reservation = &nb, nil
		if !d.workDone {
			// An unknown outcome stays in_flight: the retry reuses the key.
			s.back.requeueOp(ctx, a.opKey, j, "requeue")
		}
		return s.mesh.Requeue(ctx, j, mesh.Retried, strconv.Itoa(a.n))
	}
	if d.fallback != nil {
		if fb, ok := s.fall.fallback(j, *d.fallback); ok {
			return s.fall.reroute(ctx, a.msg, j, a.opKey, fb)
		}
	}
	if operatorError(j, out) != nil {
		// The detail (an endpoint's address, a resolver's) is the
		// operator's: logged here, never given to the caller.
		s.log.Error("provider needs operator action", "provider", j.Provider, "model", j.Model, "code", out.Code, "status", out.HTTPStatus, "err", out.Message)
	}
	return s.fin.terminal(ctx, j, a.opKey, d.status, d.reason, d.err)
}

// endStreamed ends a job whose stream got past its first token (or ended
// cleanly, or was cancelled): whatever happened, it is never retried.
func (s *outcomes) endStreamed(ctx context.Context, a *attempt) error {
	j, e := a.j, a.end
	s.m.StreamDuration.WithLabelValues(j.Provider, j.Model, string(e.status)).Observe(a.elapsed.Seconds())
	switch e.status {
	case job.StatusSucceeded:
		a.ticket.Record(true)
		s.deps.deploymentUp(ctx, a)
	case job.StatusInterrupted:
		a.ticket.Record(false)
	default:
		a.ticket.Release()
	}
	status := "200"
	if a.resp == nil {
		status = "cancelled"
	}
	s.countRequest(j, status)
	outcome := provider.Success.String()
	var aerr *job.Error
	if e.status != job.StatusSucceeded {
		outcome = string(e.status)
		aerr = &job.Error{Code: e.reason, Message: fmt.Sprint(e.err)}
	}
	at := job.Attempt{N: a.n, Provider: j.Provider, Model: j.Model, StartedAt: a.start.UTC(), DurationMS: a.elapsed.Milliseconds(), Outcome: outcome, Error: aerr}
	if a.resp != nil {
		at.Status = a.resp.Status
		s.fb.seed(ctx, j, a.resp.RateLimit)
	}
	j.Attempts = append(j.Attempts, at)
	return s.str.endStream(context.WithoutCancel(ctx), j, a.opKey, a.pub, e)
}

// countRequest counts a provider request made for j, by its status.
func (s *outcomes) countRequest(j *task.Task, status string) {
	s.m.Requests.WithLabelValues(j.Provider, j.Model, status).Inc()
	s.m.TenantRequests.WithLabelValues(j.Tenant).Inc()
}

// rateLimitHit counts a 429 of j by the limit it names and its kind.
func (s *outcomes) rateLimitHit(j *task.Task, dimension string, kind provider.RateLimitKind) {
	if dimension == "" {
		dimension = "unknown"
	}
	s.m.RateLimitHits.WithLabelValues(j.Provider, j.Model, dimension).Inc()
	s.m.RateLimitKinds.WithLabelValues(j.Provider, j.Model, string(kind)).Inc()
}

// throttled handles a rate-limit refusal of a call Sluice admitted: that is
// Sluice's misjudgement, not the job's. The limits in effect learn from it
// (at most one cut per epoch), the window gives back the tokens the
// provider did not charge, and the job goes back to admission, keeping its
// place in its tenant's queue and spending none of its attempts; only its
// deadline, or admission.max_rate_limited refusals, end it.
func (s *outcomes) throttled(ctx context.Context, msg jetstream.Msg, j *task.Task, opKey string, info provider.RateLimitInfo, start time.Time, elapsed time.Duration) error {
	s.fb.refused(ctx, j, info)
	j.RateLimited++
	capped := j.RateLimited > s.app().Admission.MaxRateLimited
	if capped {
		// Where the retry policy used to give up on a 429, the cap does: a
		// route may move the job (rate_limit_after_retry_budget,
		// batch_low_priority) before it is dead-lettered.
		sit := route.Situation{Current: config.Target{Provider: j.Provider, Model: j.Model}, Priority: string(j.Priority),
			LastClass: provider.Retry, RetryBudgetExhausted: true}
		if fb, ok := s.fall.fallback(j, sit); ok {
			return s.fall.reroute(ctx, msg, j, opKey, fb)
		}
		s.m.RateLimitRequeues.WithLabelValues(j.Provider, j.Model, "cap").Inc()
		j.Attempts = append(j.Attempts, job.Attempt{N: len(j.Attempts) + 1, Provider: j.Provider, Model: j.Model, StartedAt: start.UTC(),
			DurationMS: elapsed.Milliseconds(), Status: http.StatusTooManyRequests, Outcome: provider.Retry.String()})
		return s.fin.terminal(ctx, j, opKey, job.StatusDeadLettered, "rate_limited", &job.Error{Code: job.CodeRetriesExceeded,
			Message: fmt.Sprintf("the provider refused this job for rate %d times (admission.max_rate_limited)", j.RateLimited)})
	}
	s.m.RateLimitRequeues.WithLabelValues(j.Provider, j.Model, "requeued").Inc()
	j.Reservation = nil
	j.NotBefore = nil
	if info.RetryAfter > 0 && (j.Pinned || !s.deps.grouped(j)) {
		// (A job other deployments may take is placed again at once:
		// this one waits out the Retry-After, paused and cooled.)
		nb := s.now().Add(info.RetryAfter).UTC()
		j.NotBefore = &nb
	}
	s.back.requeueOp(ctx, opKey, j, "throttled")
	return s.mesh.Requeue(ctx, j, mesh.RateLimited, strconv.Itoa(j.RateLimited))
}
