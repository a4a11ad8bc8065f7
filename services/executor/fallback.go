package executor

import (
	"context"
	"encoding/json"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/route"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// fallbacks owns which target a job's route moves it to, and moving it
// there (reroute).
type fallbacks struct {
	*env
	fin    *finisher
	back   *requeuer
	deps   *deployments
	routes atomic.Pointer[routedBy]
}

// fallback asks the job's route for another target.
func (s *fallbacks) fallback(j *task.Task, sit route.Situation) (route.Decision, bool) {
	rt, ok := s.router().RouteFor(j.Task, j.Model)
	if !ok {
		if len(j.Attempts) == 0 {
			return route.Decision{}, false
		}
		// A job already moved to a fallback keeps its original route.
		first := j.Attempts[0]
		if rt, ok = s.router().RouteFor(j.Task, first.Model); !ok {
			return route.Decision{}, false
		}
	}
	sit.BreakerOpen = s.deps.breakerOpen
	sit.CredentialBroken = s.deps.credentialBroken
	seen := map[config.Target]bool{}
	for _, a := range j.Attempts {
		t := config.Target{Provider: a.Provider, Model: a.Model}
		if !seen[t] {
			seen[t] = true
			sit.Tried = append(sit.Tried, t)
		}
	}
	if !seen[sit.Current] {
		sit.Tried = append(sit.Tried, sit.Current)
	}
	return s.router().Next(rt, sit)
}

// reroute sends the job to a fallback target: the request names the new
// model, the estimate is redone for it, and admission reserves its budget.
func (s *fallbacks) reroute(ctx context.Context, msg jetstream.Msg, j *task.Task, opKey string, d route.Decision) error {
	body, err := withModel(j.Request, d.Target.Model)
	if err != nil {
		return s.fin.terminal(ctx, j, opKey, job.StatusFailed, "invalid", &job.Error{Code: job.CodeInvalidRequest, Message: "cannot rewrite the request for the fallback model"})
	}
	_, est, err := tokens.Estimate(j.Endpoint, body, job.Limits{}, s.app().Limits.DefaultMaxTokens)
	if err != nil {
		return s.fin.terminal(ctx, j, opKey, job.StatusFailed, "invalid", &job.Error{Code: job.CodeInvalidRequest, Message: err.Error()})
	}
	s.m.Fallbacks.WithLabelValues(j.Provider, d.Target.Provider, d.Reason).Inc()
	s.log.Info("fallback", "job_id", j.ID, "from", j.Provider+"/"+j.Model, "to", d.Target.String(), "reason", d.Reason)
	if _, m, ok := s.app().Deployment(d.Target.Provider, d.Target.Model); ok {
		// The units the new model limits, from the job's cost; units only
		// the first model limited cost nothing there. One its minute
		// cannot hold is refused by admission.
		est.Units, _ = guard.UnitCost(j.Cost, m, false)
	}
	j.Request, j.Provider, j.Model, j.Estimate = body, d.Target.Provider, d.Target.Model, &est
	j.Reservation, j.NotBefore = nil, nil
	s.guard.Seal(j)
	s.back.requeueOp(ctx, opKey, j, "reroute")
	return s.back.requeue(ctx, msg, j, opKey, backFallback)
}

// withModel returns body with its "model" replaced.
func withModel(body []byte, model string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	name, _ := json.Marshal(model)
	m["model"] = name
	return json.Marshal(m)
}

// routedBy is the router of one configuration.
type routedBy struct {
	app *config.Config
	r   *route.Router
}

// router returns the routes of the configuration in effect.
func (s *fallbacks) router() *route.Router {
	app := s.app()
	if rb := s.routes.Load(); rb != nil && rb.app == app {
		return rb.r
	}
	rb := &routedBy{app: app, r: route.New(app.Routes)}
	s.routes.Store(rb)
	return rb.r
}
