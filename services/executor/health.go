package executor

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/pkg/job"
)

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
func (s *Service) coolDeployment(ctx context.Context, j *job.Job, until time.Time) {
	if s.cfg.Health == nil {
		return
	}
	if err := s.cfg.Health.Cool(ctx, j.Provider, j.Model, until, "rate_limited"); err != nil {
		s.log.Warn("deployment health: cool", "provider", j.Provider, "model", j.Model, "err", err)
	}
}

// deploymentUp reports a call of a's that succeeded.
func (s *Service) deploymentUp(ctx context.Context, a *attempt) {
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
	case out.Class == provider.ConnectFailed && (out.Code == "connect_refused" || out.Code == "connect_timeout"):
		return "unreachable"
	}
	return ""
}

// deploymentDown takes j's deployment down for reason, no probe before
// notBefore.
func (s *Service) deploymentDown(ctx context.Context, j *job.Job, reason string, notBefore time.Time) {
	if s.cfg.Health == nil {
		return
	}
	if err := s.cfg.Health.Down(ctx, j.Provider, j.Model, reason, notBefore); err != nil {
		s.log.Warn("deployment health: down", "provider", j.Provider, "model", j.Model, "err", err)
	}
}

// grouped reports whether another deployment serves j's model.
func (s *Service) grouped(j *job.Job) bool { return s.app().Grouped(j.Model) }

// replace sends a's job, whose deployment is down, back to admission to be
// placed again: its reservation dropped, its attempts untouched, its
// operation queued again (the provider did no work).
func (s *Service) replace(ctx context.Context, a *attempt, reason string) error {
	s.m.AdmissionWaits.WithLabelValues(a.j.Provider, a.j.Model, "deployment_down").Inc()
	s.log.Info("deployment down: job goes back to be placed again", "job_id", a.j.ID, "provider", a.j.Provider, "model", a.j.Model, "reason", reason)
	return s.backToAdmission(ctx, a, nil, "deployment down", backDown)
}
