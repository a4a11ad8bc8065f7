package executor

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/breaker"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/route"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// deployments is the executor's side of "don't send there": it tells
// internal/health, which decides, what a call's outcome says of its
// deployment (cool, down, up), asks it for leave to call (its breakers),
// and sends back to be placed again a job whose deployment is down while
// another serves its model (replace).
type deployments struct {
	*env
	back *requeuer
}

// What a call's outcome says about its deployment (the provider/model the
// job was placed on), told to the whole fleet through internal/health:
//
//   - a Retry-After cools the deployment until then (the longest wait
//     wins) and pauses its dispatch; the refused job itself is Sluice's misjudgement, learned from
//     and sent back without spending an attempt (throttled);
//   - a refused key (401, 403), an endpoint that cannot be reached (the
//     connection refused or timed out) or an open breaker takes it down
//     until a probe succeeds;
//   - a success after either brings it up.
//
// A job that meets a down deployment of a model that other deployments
// serve is not failed, retried nor dead-lettered for it: it goes back to
// admission, attempts untouched, which places it on another deployment
// (a pinned job waits there for its own). A model with one deployment
// keeps the outcome's usual course.

// coolDeployment makes the fleet wait until until before placing another
// job on j's deployment; health pauses its dispatch meanwhile.
func (s *deployments) coolDeployment(ctx context.Context, j *task.Task, until time.Time) {
	if err := s.cfg.Health.Cool(ctx, j.Provider, j.Model, until, "rate_limited"); err != nil {
		s.log.Warn("deployment health: cool", "provider", j.Provider, "model", j.Model, "err", err)
	}
}

// deploymentUp reports a call of a's that succeeded.
func (s *deployments) deploymentUp(ctx context.Context, a *attempt) {
	if err := s.cfg.Health.Up(ctx, a.j.Provider, a.j.Model, a.start); err != nil {
		s.log.Warn("deployment health: up", "provider", a.j.Provider, "model", a.j.Model, "err", err)
	}
}

// downReason is why out takes its deployment down ("": it does not).
func downReason(out provider.Outcome) string {
	switch {
	case out.Class == provider.AuthBroken:
		return fmt.Sprintf("auth_%d", out.HTTPStatus)
	case out.Class == provider.OperatorAction:
		return "quota"
	case out.Unreachable():
		// Refused, timed out, a name that does not resolve, a TLS
		// handshake that fails: the endpoint, not the request.
		return "unreachable"
	}
	return ""
}

// operatorError is what the caller is told of an outcome that is the
// deployment's problem rather than the request's (nil: it is not): the
// deployment by name, never its URL or the resolver's address, which
// are the operator's (they are logged).
func operatorError(j *task.Task, out provider.Outcome) *job.Error {
	dep := j.Provider + "/" + j.Model
	const tail = "; this is the deployment's problem, not the request's, and the operator must fix it (the deployment is marked down)"
	switch {
	case out.Class == provider.AuthBroken:
		return &job.Error{Code: job.CodeDeploymentAuth,
			Message: fmt.Sprintf("deployment %s: the provider refused the operator's API key for it (HTTP %d)%s", dep, out.HTTPStatus, tail)}
	case out.Class == provider.OperatorAction:
		e := out.JobError()
		e.Message = fmt.Sprintf("deployment %s: the provider's account is out of quota or credit (%s)%s", dep, e.Code, tail)
		return e
	case downReason(out) == "unreachable":
		return &job.Error{Code: job.CodeDeploymentUnreachable,
			Message: fmt.Sprintf("deployment %s: the provider cannot be reached (%s)%s", dep, out.Code, tail)}
	}
	return nil
}

// deploymentDown takes j's deployment down for reason, no probe before
// notBefore.
func (s *deployments) deploymentDown(ctx context.Context, j *task.Task, reason string, notBefore time.Time) {
	if err := s.cfg.Health.Down(ctx, j.Provider, j.Model, reason, notBefore); err != nil {
		s.log.Warn("deployment health: down", "provider", j.Provider, "model", j.Model, "err", err)
	}
}

// grouped reports whether another deployment serves j's model.
func (s *deployments) grouped(j *task.Task) bool { return s.app().Grouped(j.Model) }

// replace sends a's job, whose deployment is down, back to admission to be
// placed again: its reservation dropped, its attempts untouched, its
// operation queued again (the provider did no work).
func (s *deployments) replace(ctx context.Context, a *attempt, reason string) error {
	s.m.AdmissionWaits.WithLabelValues(a.j.Provider, a.j.Model, "deployment_down").Inc()
	s.log.Info("deployment down: job goes back to be placed again", "job_id", a.j.ID, "provider", a.j.Provider, "model", a.j.Model, "reason", reason)
	return s.back.backToAdmission(ctx, a, nil, "deployment down", backDown)
}

// operatorEnd turns d, the decision for an outcome that is the
// deployment's problem, into the job's end with the caller's error oe: a
// deployment that cannot be reached is marked down, and retrying it on
// the job's own clock (five attempts in seconds) would only make the
// caller wait for the same answer; a route may still name a fallback.
func operatorEnd(j *task.Task, out provider.Outcome, d decision, oe *job.Error) decision {
	if d.verdict == retryLater {
		d.verdict, d.delay = endOrFallBack, 0
		d.fallback = &route.Situation{Current: config.Target{Provider: j.Provider, Model: j.Model}, Priority: string(j.Priority), LastClass: out.Class}
	}
	if d.verdict == endOrFallBack {
		d.status, d.reason, d.err = job.StatusFailed, out.Class.String(), oe
	}
	return d
}

// take asks health for leave to call j's deployment (its breaker in this
// process): nil when the breaker is open, until openUntil, and health took
// the deployment down.
func (s *deployments) take(ctx context.Context, j *task.Task) (tk *breaker.Ticket, openUntil time.Time) {
	tk, state, openUntil := s.cfg.Health.Take(ctx, j.Provider, j.Model)
	s.m.BreakerState.WithLabelValues(j.Provider, j.Model).Set(breakerGauge[state])
	return tk, openUntil
}

// breakerOpen reports whether t's breaker is open in this process.
func (s *deployments) breakerOpen(t config.Target) bool {
	return s.cfg.Health.BreakerOpen(t.Provider, t.Model)
}

// credentialBroken reports whether t's provider refused its key lately
// (health's quarantine).
func (s *deployments) credentialBroken(t config.Target) bool {
	return s.cfg.Health.CredentialBroken(t.Provider)
}
