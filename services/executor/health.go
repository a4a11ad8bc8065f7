package executor

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/breaker"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/route"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// deployments owns what this process tells the fleet of a deployment's
// health (cool, down, up, pause) and the per-process breakers that
// stop its calls to a failing one.
type deployments struct {
	*env
	back     *requeuer
	breakers *breaker.Set
}

// What a call's outcome says about its deployment (the provider/model the
// job was placed on), told to the whole fleet through internal/health:
//
//   - a Retry-After cools the deployment until then (the longest wait
//     wins); the refused job itself is Sluice's misjudgement, learned from
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
// job on j's deployment.
func (s *deployments) coolDeployment(ctx context.Context, j *job.Job, until time.Time) {
	if s.cfg.Health == nil {
		return
	}
	if err := s.cfg.Health.Cool(ctx, j.Provider, j.Model, until, "rate_limited"); err != nil {
		s.log.Warn("deployment health: cool", "provider", j.Provider, "model", j.Model, "err", err)
	}
}

// deploymentUp reports a call of a's that succeeded.
func (s *deployments) deploymentUp(ctx context.Context, a *attempt) {
	if s.cfg.Health == nil {
		return
	}
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
	case out.Class == provider.ConnectFailed && out.Code != "canceled" && out.Code != "deadline_exceeded":
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
func operatorError(j *job.Job, out provider.Outcome) *job.Error {
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
func (s *deployments) deploymentDown(ctx context.Context, j *job.Job, reason string, notBefore time.Time) {
	if s.cfg.Health == nil {
		return
	}
	if err := s.cfg.Health.Down(ctx, j.Provider, j.Model, reason, notBefore); err != nil {
		s.log.Warn("deployment health: down", "provider", j.Provider, "model", j.Model, "err", err)
	}
}

// grouped reports whether another deployment serves j's model.
func (s *deployments) grouped(j *job.Job) bool { return s.app().Grouped(j.Model) }

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
func operatorEnd(j *job.Job, out provider.Outcome, d decision, oe *job.Error) decision {
	if d.verdict == retryLater {
		d.verdict, d.delay = endOrFallBack, 0
		d.fallback = &route.Situation{Current: config.Target{Provider: j.Provider, Model: j.Model}, Priority: string(j.Priority), LastClass: out.Class}
	}
	if d.verdict == endOrFallBack {
		d.status, d.reason, d.err = job.StatusFailed, out.Class.String(), oe
	}
	return d
}

// pause holds a model's dispatch fleet-wide until until: admission stops
// reserving for it and the model's DISPATCH consumer is paused.
func (s *deployments) pause(ctx context.Context, j *job.Job, until time.Time) {
	if err := s.mesh.Pause(j.Provider, j.Model, until); err != nil {
		s.log.Debug("pause signal", "err", err)
	}
	name := keys.DispatchConsumer(j.Provider, job.ModelToken(j.Model))
	if _, err := s.mesh.JS.PauseConsumer(ctx, streams.Dispatch, name, until); err != nil {
		s.log.Debug("pause consumer", "consumer", name, "err", err)
	}
	s.m.Pauses.WithLabelValues(j.Provider, j.Model).Inc()
}
