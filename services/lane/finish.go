package lane

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/pkg/job"
)

// What a line's end was decided to be (line.Res), before it is acted on.
const (
	resResult  = "result"  // succeeded: the job's result
	resFailed  = "failed"  // errored, not to be retried: failed or dead-lettered
	resRetry   = "retry"   // errored, retryable: the normal lane, later
	resSync    = "sync"    // not run (expired, cancelled, left out): the normal lane
	resUnknown = "unknown" // may have run: outcome_unknown
)

// finisher owns a line's end: what it is decided to be, as a synchronous
// call's answer would be, and acting on it: a result or a failure (its
// dead letter first) through mesh.Finish, or the normal lane through
// mesh.Requeue; and so for any held job the lane sends to the normal lane
// or ends outcome_unknown.
type finisher struct {
	*env
	jobs *gatherer
	sub  *submitter
}

// decide classifies a line's end as a synchronous call's would be.
func (c *finisher) decide(h *held, r resultOf) string {
	switch {
	case r.CustomID == "":
		return resSync // in no result file: not run
	case r.Result == provider.LineSucceeded:
		return resResult
	case r.Result == provider.LineErrored:
		if c.plan(h, r.Outcome).Retry {
			return resRetry
		}
		return resFailed
	}
	return resSync
}

func (c *finisher) plan(h *held, o provider.Outcome) provider.Decision {
	pol := c.app().Policy(h.j.Priority)
	p := provider.Policy{MaxAttempts: pol.MaxAttempts, MaxElapsed: pol.MaxElapsed.D(), BaseDelay: pol.BaseDelay.D(), MaxDelay: pol.MaxDelay.D()}
	first := c.now()
	if len(h.j.Attempts) > 0 {
		first = h.j.Attempts[0].StartedAt
	}
	return provider.Plan(p, o, len(h.j.Attempts)+1, first, c.now(), h.j.Deadline, rand.New(rand.NewPCG(uint64(h.seq), 1)))
}

// end acts on a line's decided end and acknowledges its LANE message;
// it reports whether both happened.
func (c *finisher) end(ctx context.Context, o *open, h *held, l *line, r resultOf) bool {
	by := markPrefix + o.rec.ID
	c.ms.LaneLines.WithLabelValues(c.provider, c.model, lineOutcome(r)).Inc()
	var err error
	switch l.Res {
	case resResult:
		h.j.Attempts = append(h.j.Attempts, c.attempt(h, provider.Outcome{Class: provider.Success, HTTPStatus: 200}, o))
		err = c.publish(ctx, h, mesh.Outcome{Status: job.StatusSucceeded, Response: r.Body, Usage: &r.Usage}, o.rec.BatchID)
	case resFailed:
		h.j.Attempts = append(h.j.Attempts, c.attempt(h, r.Outcome, o))
		d := c.plan(h, r.Outcome)
		status, e := job.StatusFailed, r.Outcome.JobError()
		if d.Reason != provider.ReasonNotRetryable && d.Reason != "" {
			status, e = job.StatusDeadLettered, &job.Error{Code: job.CodeRetriesExceeded, Message: fmt.Sprintf("%s after a batch line; last error %s: %s", d.Reason, e.Code, e.Message)}
		}
		err = c.terminal(ctx, h, status, d.Reason, e, o.rec.BatchID)
	case resRetry:
		h.j.Attempts = append(h.j.Attempts, c.attempt(h, r.Outcome, o))
		nb := c.now().Add(c.plan(h, r.Outcome).Delay).UTC()
		h.j.NotBefore = &nb
		err = c.back(ctx, h, by)
	case resUnknown:
		err = c.terminal(ctx, h, job.StatusFailed, dlq.ReasonOutcomeUnknown, &job.Error{Code: dlq.ReasonOutcomeUnknown,
			Message: "outcome unknown: the batch holding this job may have been created at the provider, and billed; Sluice does not submit it again. An operator can replay it: sluice dlq replay --tenant " + h.j.Tenant + " " + h.j.ID}, "")
	default:
		err = c.back(ctx, h, by)
	}
	if err != nil {
		c.log.Warn("lane: line not ended; retrying", "job_id", h.j.ID, "res", l.Res, "err", err)
		return false
	}
	return h.msg.DoubleAck(ctx) == nil
}

func lineOutcome(r resultOf) string {
	if r.CustomID == "" {
		return "cancelled"
	}
	return r.Result.String()
}

func (c *finisher) attempt(h *held, o provider.Outcome, op *open) job.Attempt {
	return job.Attempt{N: len(h.j.Attempts) + 1, Provider: c.provider, Model: c.model, StartedAt: op.rec.Created,
		DurationMS: c.now().Sub(op.rec.Created).Milliseconds(), Status: o.HTTPStatus, Outcome: "batch_" + o.Class.String(), Error: o.JobError()}
}

// back sends a job to the normal lane, marked NoLane: its batch's mark
// withdrawn first (so the executor does not take it for a lost call),
// then QUEUE with a message id that dedupes a repeat.
func (c *finisher) back(ctx context.Context, h *held, by string) error {
	if by != "" {
		c.sub.withdraw(ctx, h.opKey, by)
	}
	h.j.NoLane = true
	if err := c.m.Requeue(ctx, h.j, mesh.LaneSync, fmt.Sprint(h.seq)); err != nil {
		return err
	}
	c.ms.LaneJobs.WithLabelValues(c.provider, c.model, "sync").Inc()
	return nil
}

// toSync sends a job this process holds and has not put in a running batch
// to the normal lane and lets its LANE message go.
func (c *finisher) toSync(ctx context.Context, h *held, by, why string) {
	c.log.Info("lane: job sent to the normal lane", "job_id", h.j.ID, "tenant", h.j.Tenant, "why", why)
	if err := c.back(ctx, h, by); err != nil {
		_ = h.msg.NakWithDelay(c.tick)
	} else {
		_ = h.msg.DoubleAck(ctx)
	}
	delete(c.jobs.held, h.j.Key())
}

// cancelled ends a job its caller cancelled before it went in a batch
// (its operation record marked cancelled): never submitted, its cancelled
// result (published by the cancel already; mesh.Finish keeps one) and its
// LANE message let go. It counts as no lane's job.
func (c *finisher) cancelled(ctx context.Context, h *held) {
	c.log.Info("lane: job cancelled by its caller; not submitted", "job_id", h.j.ID, "tenant", h.j.Tenant)
	err := c.publish(ctx, h, mesh.Outcome{Status: job.StatusCancelled, Error: &job.Error{Code: job.CodeCancelled,
		Message: "cancelled by the caller before the provider was called"}}, "")
	if err != nil {
		_ = h.msg.NakWithDelay(c.tick)
	} else {
		_ = h.msg.DoubleAck(ctx)
	}
	delete(c.jobs.held, h.j.Key())
}

// unknown ends a job that may be in a batch this lane cannot follow.
func (c *finisher) unknown(ctx context.Context, h *held, why string) {
	c.log.Warn("lane: job's batch unknown; it ends outcome_unknown", "job_id", h.j.ID, "tenant", h.j.Tenant, "why", why)
	if c.terminal(ctx, h, job.StatusFailed, dlq.ReasonOutcomeUnknown, &job.Error{Code: dlq.ReasonOutcomeUnknown,
		Message: "outcome unknown (" + why + "): Sluice does not submit it again"}, "") == nil {
		_ = h.msg.DoubleAck(ctx)
	}
	delete(c.jobs.held, h.j.Key())
}

// terminal ends a job a batch line failed: its dead letter first, then
// its result.
func (c *finisher) terminal(ctx context.Context, h *held, status job.Status, reason string, e *job.Error, batchID string) error {
	if err := dlq.Publish(ctx, c.m.JS, &dlq.Entry{Job: *h.j, Reason: reason, LastError: e, DeadAt: c.now().UTC()}); err != nil {
		return err
	}
	c.ms.DeadLetters.WithLabelValues(reason).Inc()
	c.ms.LaneJobs.WithLabelValues(c.provider, c.model, "failed").Inc()
	return c.publish(ctx, h, mesh.Outcome{Status: status, Error: e}, batchID)
}

// publish ends a lane job through the mesh's one finish: its deployment,
// and for a line of a batch the lane and the batch id, so the result is
// priced at the model's batch factor (config.PriceResult).
func (c *finisher) publish(ctx context.Context, h *held, o mesh.Outcome, batchID string) error {
	o.Provider, o.Model = c.provider, c.model
	if batchID != "" {
		o.Lane, o.BatchID = job.LaneBatch, batchID
	}
	app := c.app()
	r, err := c.m.Finish(ctx, h.j, o, mesh.Exit{OpKey: h.opKey, Hints: mesh.ResultHints{Facts: mesh.FactsOf(h.j)}, Price: app, Wait: 30 * time.Second})
	if err != nil {
		return err
	}
	if r.Cost != nil {
		if full, ok := app.CostOf(r.Provider, r.Model, job.LaneSync, r.Usage); ok && full > *r.Cost {
			c.ms.LaneSaved.WithLabelValues(c.provider, c.model).Add(full - *r.Cost)
		}
	}
	if r.Status == job.StatusSucceeded {
		c.ms.LaneJobs.WithLabelValues(c.provider, c.model, "batch").Inc()
	}
	return nil
}
