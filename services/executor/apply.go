package executor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// conclude settles what a call's outcome calls for: a call that did not
// leave goes back to admission, a stream past its first token ends as it
// ended, and any other outcome is classified, decided and applied.
func (s *Service) conclude(ctx context.Context, a *attempt) error {
	j := a.j
	if errors.Is(a.cerr, provider.ErrSendLate) {
		// Not sent: the connection came (or the request was built) after
		// the instant it had to leave by.
		return s.notSent(ctx, a)
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
		s.deploymentUp(ctx, a) // health.go
	case provider.Overloaded, provider.ConnectFailed, provider.Unknown:
		a.ticket.Record(false)
	default:
		a.ticket.Release() // 429s and request errors say nothing about the provider's health
	}
	if out.Class == provider.AuthBroken {
		s.markBroken(a.target)
	}
	if reason := downReason(out); reason != "" {
		s.deploymentDown(ctx, j, reason, time.Time{})
		if s.grouped(j) {
			return s.replace(ctx, a, reason)
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
	d := decide(j, o, policy, s.mayCallAgain(j), s.rnd)
	s.rndMu.Unlock()
	if oe := operatorError(j, out); oe != nil {
		d = operatorEnd(j, out, d, oe) // health.go
	}
	return s.apply(ctx, a, out, d)
}

// apply carries out decision d on the outcome out of attempt a.
func (s *Service) apply(ctx context.Context, a *attempt, out provider.Outcome, d decision) error {
	j := a.j
	if d.rate != nil {
		if d.rate.RetryAfter > 0 {
			// The provider asked to wait (in its headers, or in its body as
			// Gemini does): the whole fleet waits, instead of every executor
			// finding out with a 429 of its own.
			s.pause(ctx, j, s.now().Add(d.rate.RetryAfter))
			s.coolDeployment(ctx, j, s.now().Add(d.rate.RetryAfter)) // health.go
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
		s.seed(ctx, j, a.resp.RateLimit)
	}
	switch d.verdict {
	case endTooLarge:
		// The job's budget stays charged at the reservation.
		return s.finish(ctx, j, a.opKey, &mesh.Outcome{Status: job.StatusFailed, Error: s.tooLarge()})
	case settleResult:
		s.settle(ctx, j, a.resp.Usage)
		var inFlight *mesh.OpRecord
		if a.opRev > 0 {
			inFlight = a.op
		}
		return s.finishHinted(ctx, j, a.opKey, &mesh.Outcome{Status: job.StatusSucceeded, Response: a.resp.Body, Usage: &a.resp.Usage,
			ProviderRequestID: provider.RequestID(a.resp.Header)}, inFlight, a.opRev)
	case endUnknown:
		return s.outcomeUnknown(ctx, j, a.opKey, d.reason)
	case retryLater:
		s.m.Retries.WithLabelValues(j.Provider, j.Model, out.Class.String()).Inc()
		nb := s.now().Add(d.delay).UTC()
		j.NotBefore, j.Reservation = &nb, nil
		if !d.workDone {
			// An unknown outcome stays in_flight: the retry reuses the key.
			s.requeueOp(ctx, a.opKey, j, "requeue")
		}
		return s.mesh.Requeue(ctx, j, mesh.Retried, strconv.Itoa(a.n))
	}
	if d.fallback != nil {
		if fb, ok := s.fallback(j, *d.fallback); ok {
			return s.reroute(ctx, a.msg, j, a.opKey, fb)
		}
	}
	if operatorError(j, out) != nil {
		// The detail (an endpoint's address, a resolver's) is the
		// operator's: logged here, never given to the caller.
		s.log.Error("provider needs operator action", "provider", j.Provider, "model", j.Model, "code", out.Code, "status", out.HTTPStatus, "err", out.Message)
	}
	return s.terminal(ctx, j, a.opKey, d.status, d.reason, d.err)
}

// endStreamed ends a job whose stream got past its first token (or ended
// cleanly, or was cancelled): whatever happened, it is never retried.
func (s *Service) endStreamed(ctx context.Context, a *attempt) error {
	j, e := a.j, a.end
	s.m.StreamDuration.WithLabelValues(j.Provider, j.Model, string(e.status)).Observe(a.elapsed.Seconds())
	switch e.status {
	case job.StatusSucceeded:
		a.ticket.Record(true)
		s.deploymentUp(ctx, a)
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
		s.seed(ctx, j, a.resp.RateLimit)
	}
	j.Attempts = append(j.Attempts, at)
	return s.endStream(context.WithoutCancel(ctx), j, a.opKey, a.pub, e)
}

// countRequest counts a provider request made for j, by its status.
func (s *Service) countRequest(j *task.Task, status string) {
	s.m.Requests.WithLabelValues(j.Provider, j.Model, status).Inc()
	s.m.TenantRequests.WithLabelValues(j.Tenant).Inc()
}

// rateLimitHit counts a 429 of j by the limit it names and its kind.
func (s *Service) rateLimitHit(j *task.Task, dimension string, kind provider.RateLimitKind) {
	if dimension == "" {
		dimension = "unknown"
	}
	s.m.RateLimitHits.WithLabelValues(j.Provider, j.Model, dimension).Inc()
	s.m.RateLimitKinds.WithLabelValues(j.Provider, j.Model, string(kind)).Inc()
}
