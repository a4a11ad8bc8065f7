package lane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	ilane "github.com/sluice-dev/sluice/internal/lane"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/pkg/job"
)

// submitter owns sending the collected jobs as a batch: when one is due
// and which jobs it takes (a deadline too near, the budget's room, the
// provider's limit), its record and its jobs' sent marks written before
// the create call, the create's answer, and taking back a batch that
// never ran.
type submitter struct {
	*env
	jobs   *gatherer
	recs   *records
	budget *laneBudget
	fin    *finisher
	fol    *follower

	waitTil time.Time // the budget had no room: wait until then
	// most is the lines the next batch may hold: halved by each refusal
	// for the provider's limit, back to max_lines by a batch it takes.
	most         int
	refusedAlone int // refusals in a row of a batch of one job
}

// divertDue sends to the normal lane the pending jobs that could no longer
// finish in a batch before their rescue point (they waited for room), and
// those a reload took off the lane (their tenant has a spend budget now,
// which only the normal lane's gate holds, or the lane is off).
func (c *submitter) divertDue(ctx context.Context) {
	now, app := c.now(), c.app()
	kept := c.jobs.pending[:0]
	for _, key := range c.jobs.pending {
		h := c.jobs.held[key]
		if h.j.Deadline != nil && !now.Before(h.j.Deadline.Add(-c.lane.Rescue.D()-c.lane.Collect.D())) {
			c.fin.toSync(ctx, h, "", "too near its deadline for a batch")
			continue
		}
		if !ilane.Kept(app, h.j.Tenant, c.provider, h.j.Model) {
			c.fin.toSync(ctx, h, "", "no longer for the batch lane (a spend budget, or the lane off, since a reload)")
			continue
		}
		kept = append(kept, key)
	}
	c.jobs.pending = kept
}

// submitDue sends the pending jobs as one batch once they were collected
// for collect (or fill max_lines), within the room the budget has, taken
// tenant by tenant in turn (byTenant).
func (c *submitter) submitDue(ctx context.Context) {
	now := c.now()
	if len(c.jobs.pending) == 0 || now.Before(c.waitTil) || (now.Sub(c.jobs.since) < c.lane.Collect.D() && len(c.jobs.pending) < c.lane.MaxLines) {
		return
	}
	room, err := c.budget.room(ctx, c.limit)
	if err != nil {
		c.log.Warn("lane: budget unreadable", "provider", c.provider, "model", c.model, "err", err)
		return
	}
	var take []*held
	var amount int64
	order := byTenant(c.jobs.pending, c.jobs.held)
	for _, key := range order {
		h := c.jobs.held[key]
		cost := c.costOf(h)
		if len(take) == c.most || amount+cost > room {
			break
		}
		take, amount = append(take, h), amount+cost
	}
	if len(take) == 0 {
		if h := c.jobs.held[order[0]]; c.limit > 0 && c.costOf(h) > c.limit {
			c.jobs.pending = slices.DeleteFunc(c.jobs.pending, func(k string) bool { return k == order[0] })
			c.fin.toSync(ctx, h, "", "larger alone than the lane's batch budget")
			return
		}
		c.wait("the batch budget has no room")
		return
	}
	rec := &record{ID: strings.ReplaceAll(job.NewID(), "-", ""), State: stateSubmitting, Created: now.UTC(), Reserved: amount, Lines: map[string]*line{}}
	for i, h := range take {
		rec.Lines[fmt.Sprint(i)] = &line{Tenant: h.j.Tenant, Job: h.j.ID, Op: h.opKey, Seq: h.seq, Tokens: c.costOf(h)}
		if d := h.j.Deadline; d != nil && (rec.Earliest == nil || d.Before(*rec.Earliest)) {
			rec.Earliest = d
		}
	}
	if ok, err := c.budget.reserve(ctx, rec.ID, amount, c.limit); err != nil || !ok {
		c.wait("the batch budget has no room")
		return
	}
	o := &open{rec: rec}
	if err := c.recs.put(ctx, o); err != nil {
		_ = c.budget.release(ctx, rec.ID)
		c.log.Warn("lane: batch record not written; not submitted", "provider", c.provider, "model", c.model, "err", err)
		return
	}
	c.recs.batches[rec.ID] = o
	taken := make(map[string]bool, len(take))
	for _, h := range take {
		taken[h.j.Key()] = true
	}
	c.jobs.pending = slices.DeleteFunc(c.jobs.pending, func(k string) bool { return taken[k] })
	c.jobs.since = now
	c.submit(ctx, o, take)
}

// byTenant is the pending jobs in the order a batch takes them: one of
// each tenant's in turn, each tenant's in arrival order, the tenants in
// the order of their oldest job. One tenant's backlog does not fill the
// batch (or the lane's budget) ahead of the others' jobs.
func byTenant(pending []string, held map[string]*held) []string {
	var tenants []string
	queues := map[string][]string{}
	for _, key := range pending {
		t := held[key].j.Tenant
		if _, ok := queues[t]; !ok {
			tenants = append(tenants, t)
		}
		queues[t] = append(queues[t], key)
	}
	if len(tenants) < 2 {
		return pending
	}
	out := make([]string, 0, len(pending))
	for len(out) < len(pending) {
		for _, t := range tenants {
			if q := queues[t]; len(q) > 0 {
				out, queues[t] = append(out, q[0]), q[1:]
			}
		}
	}
	return out
}

// costOf is what a job holds of the budget: its prompt estimate (OpenAI's
// enqueued tokens) or one request (Anthropic's queue).
func (c *submitter) costOf(h *held) int64 {
	if c.unit == "requests" {
		return 1
	}
	if h.j.Estimate != nil {
		return int64(h.j.Estimate.PromptTokens)
	}
	return 1
}

func (c *submitter) wait(why string) {
	c.waitTil = c.now().Add(c.lane.Poll.D())
	c.ms.LaneWaits.WithLabelValues(c.provider, c.model).Inc()
	c.log.Debug("lane: jobs wait", "provider", c.provider, "model", c.model, "why", why, "pending", len(c.jobs.pending))
}

// submit marks each job's operation record as in this batch, then submits
// the batch with its local id as its key, and records the provider's id.
func (c *submitter) submit(ctx context.Context, o *open, take []*held) {
	req := provider.BatchRequest{Model: c.upstream, Key: o.rec.ID}
	name, _ := json.Marshal(c.upstream)
	now := c.now()
	for id, l := range o.rec.Lines {
		h := c.jobs.held[keyOf(l)]
		if err := c.mark(ctx, o, h, now); err != nil {
			delete(o.rec.Lines, id)
			if errors.Is(err, errCancelled) {
				c.fin.cancelled(ctx, h)
			} else if h != nil {
				c.fin.toSync(ctx, h, "", "its operation record could not be marked")
			}
			continue
		}
		req.Lines = append(req.Lines, provider.BatchLine{CustomID: id, Body: job.WithMember(h.j.Request, "model", name)})
	}
	if len(req.Lines) == 0 {
		c.unwind(ctx, o, false)
		return
	}
	o.rec.State = stateCalling
	if err := c.recs.put(ctx, o); err != nil { // the lines that were marked, and the call
		c.log.Warn("lane: batch record not updated; not submitted", "provider", c.provider, "model", c.model, "err", err)
		o.rec.State = stateSubmitting
		return // resolved by follow: unwound, its jobs collected again
	}
	b, err := c.client.Submit(ctx, req)
	if err != nil {
		c.submitFailed(ctx, o, err)
		return
	}
	c.started(ctx, o, b)
}

// started records the provider's batch id.
func (c *submitter) started(ctx context.Context, o *open, b provider.Batch) {
	o.rec.BatchID, o.rec.State = b.ID, stateRunning
	if err := c.recs.put(ctx, o); err != nil {
		c.log.Warn("lane: provider batch id not recorded", "provider", c.provider, "model", c.model, "batch", b.ID, "err", err)
	}
	o.lastPoll = c.now()
	c.ms.LaneBatches.WithLabelValues(c.provider, c.model, "submitted").Inc()
	c.most, c.refusedAlone = c.lane.MaxLines, 0
	c.log.Info("lane: batch submitted", "provider", c.provider, "model", c.model, "batch", b.ID, "lines", len(o.rec.Lines))
}

// mark writes the job's operation record in_flight with a sent mark
// naming the batch: a redelivery, a restart or another process then knows
// the job may be in this batch and never submits it again. A record its
// caller's cancel marked first is errCancelled: the job is not submitted.
func (c *submitter) mark(ctx context.Context, o *open, h *held, now time.Time) error {
	if h == nil {
		return errNotHeld
	}
	by := markPrefix + o.rec.ID
	cancelled := false
	_, err := c.m.UpdateOp(ctx, h.opKey, func(r *mesh.OpRecord) bool {
		cancelled = r.Cancelled && r.JobID == h.j.ID
		if cancelled || (r.Sent != nil && r.Sent.By == by) {
			return false
		}
		if r.Sent != nil || r.State == mesh.OpCompleted || r.State == mesh.OpFailed {
			return false
		}
		r.State, r.Provider, r.Model, r.Attempt = mesh.OpInFlight, c.provider, c.model, len(h.j.Attempts)+1
		r.Sent, r.UpdatedAt = &mesh.SentMark{Attempt: len(h.j.Attempts) + 1, At: now.UTC(), By: by}, now.UTC()
		return true
	})
	switch {
	case errors.Is(err, job.ErrNotFound):
		return nil // no operation record (an old job): the batch record holds it
	case err != nil:
		return err
	case cancelled:
		return errCancelled
	}
	op, _, err := c.m.GetOp(ctx, h.opKey)
	if err != nil {
		return err
	}
	if op.Sent == nil || op.Sent.By != by {
		return errNotMarked
	}
	return nil
}

// Why mark did not mark a job.
var (
	errCancelled = errors.New("lane: the job's caller cancelled it")
	errNotHeld   = errors.New("lane: the job is not held here")
	errNotMarked = errors.New("lane: the job's operation record is marked otherwise")
)

// submitFailed handles a Submit that did not answer with a batch.
func (c *submitter) submitFailed(ctx context.Context, o *open, err error) {
	var te *provider.TransportError
	var he *provider.BatchHTTPError
	switch {
	case errors.Is(err, provider.ErrEnqueuedTokenLimit), errors.Is(err, provider.ErrBatchQueueFull):
		c.refused(ctx, o)
	case errors.As(err, &te), errors.As(err, &he) && he.Outcome.HTTPStatus >= 500:
		// The create may have reached the provider: found by its key, or
		// resolved as unknown (resolveUnknown).
		c.log.Warn("lane: batch submission's outcome unknown", "provider", c.provider, "model", c.model, "local_id", o.rec.ID, "err", err)
		c.fol.resolveSubmitting(ctx, o)
	default:
		c.log.Warn("lane: batch refused; its jobs go to the normal lane", "provider", c.provider, "model", c.model, "err", err)
		c.ms.LaneBatches.WithLabelValues(c.provider, c.model, "failed").Inc()
		c.unwind(ctx, o, false)
	}
}

// refused takes back a batch the provider's batch limit refused: its jobs
// wait, and the next batch is half its size; a batch of one job refused
// maxRefusedAlone times in a row goes to the normal lane.
func (c *submitter) refused(ctx context.Context, o *open) {
	c.ms.LaneBatches.WithLabelValues(c.provider, c.model, "refused").Inc()
	c.most = max(1, len(o.rec.Lines)/2)
	if len(o.rec.Lines) == 1 {
		c.refusedAlone++
	}
	if c.refusedAlone >= maxRefusedAlone {
		// One job refused alone, again and again: larger than the
		// provider's limit, or the limit taken by others. Not a loop.
		c.refusedAlone = 0
		c.unwind(ctx, o, false)
		return
	}
	c.unwind(ctx, o, true)
	c.wait("the provider's batch limit is reached")
}

// unwind takes back a batch that never ran: its jobs' marks withdrawn and
// its budget released, then the jobs collected again (wait) or sent to the
// normal lane, and its record deleted.
func (c *submitter) unwind(ctx context.Context, o *open, wait bool) {
	by := markPrefix + o.rec.ID
	var again []string
	for _, l := range o.rec.Lines {
		key := keyOf(l)
		if wait {
			c.withdraw(ctx, l.Op, by)
			if _, ok := c.jobs.held[key]; ok {
				again = append(again, key)
			}
			continue
		}
		if h, ok := c.jobs.held[key]; ok {
			c.fin.toSync(ctx, h, by, "its batch was refused")
		}
	}
	_ = c.budget.release(ctx, o.rec.ID)
	if err := c.recs.drop(ctx, o); err != nil {
		c.log.Warn("lane: batch record not deleted", "local_id", o.rec.ID, "err", err)
	}
	if len(again) > 0 {
		c.jobs.pending = append(again, c.jobs.pending...)
		c.jobs.since = c.now()
	}
}

// withdraw clears a batch's sent mark from an operation record.
func (c *submitter) withdraw(ctx context.Context, opKey, by string) {
	_, _ = c.m.UpdateOp(ctx, opKey, func(r *mesh.OpRecord) bool {
		if r.Sent == nil || r.Sent.By != by {
			return false
		}
		r.State, r.Sent = mesh.OpQueued, nil
		return true
	})
}

func keyOf(l *line) string { return job.KeyOf(l.Tenant, l.Job) }

// maxRefusedAlone bounds the refusals of a batch of one job.
const maxRefusedAlone = 10
