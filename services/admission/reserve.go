package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/pkg/job"
)

// pub is a dispatch published and not confirmed yet.
type pub struct {
	id  string
	msg jetstream.Msg
	fut jetstream.PubAckFuture
}

// reserve places the job it, popped from its model's queue in fair order:
// the job passes its gates (gate.go), takes room on the model's schedule
// (lease) and is published to DISPATCH with its reservation. A job the
// budgets refuse goes back to the head of its queue (or waits in QUEUE, or
// expires), and the model sleeps until its budget is expected to free.
func (s *Service) reserve(ctx context.Context, ms *modelState, it *Item) *pub {
	c := it.Value.(*Candidate)
	c.Cost = s.placedCost(ms, c.Job)       // the correction now, not at arrival
	s.netOfCache(ctx, ms, []*Candidate{c}) // anthropic.go
	_, model, ok := s.cfg.App.ModelRef(ms.model)
	if !ok {
		s.fail(ctx, c, &job.Error{Code: job.CodeUnknownModel, Message: fmt.Sprintf("model %q is no longer configured", ms.model)})
		return nil
	}
	taken, passed, err := s.passGates(ctx, c, s.gatesFor(c, ms.provider, model))
	if err != nil {
		s.storeDown(ms.key, err)
		s.unpop(ms, it)
		s.sleep(ms, s.now().Add(time.Second), "budget_store")
		return nil
	}
	if !passed {
		return nil
	}
	lim, backlog := s.limitsFor(ctx, ms, model, c, it.Urgent)
	g, err := s.lease(ctx, ms.key, lim, []*Candidate{c}, backlog, it.Urgent)
	if err == nil && (len(g.SendAt) < g.N || len(g.Planned) < g.N) {
		err = fmt.Errorf("lease granted %d jobs with %d send instants", g.N, len(g.SendAt))
	}
	if g.N == 0 {
		// The model cannot take the job now: what its gates took goes back.
		s.giveBack(ctx, taken)
	}
	if err != nil {
		// Fail closed: no budget, no dispatch.
		s.storeDown(ms.key, err)
		s.unpop(ms, it)
		s.sleep(ms, s.now().Add(time.Second), "budget_store")
		return nil
	}
	s.storeUp()
	if g.N == 0 {
		s.waitForBudget(ctx, ms, it, g)
		return nil
	}
	ms.wakeAt, ms.reason = time.Time{}, ""
	return s.publish(ms, c, g.SendAt[0], g.Planned[0], lim)
}

// limitsFor is what c is placed against on ms: the limits in effect, with
// the headroom backlogged work leaves while urgent work is about, and the
// backlog behind c to ask room for with it.
func (s *Service) limitsFor(ctx context.Context, ms *modelState, model *config.Model, c *Candidate, urgent bool) (budget.Limits, budget.Cost) {
	eff := s.effective(ctx, ms, *model)
	lim := eff.Limits()
	// Units are paced like requests and tokens at their configured limits
	// (not learned from the provider).
	lim.Units = ms.unitLimits
	if h := s.cfg.App.Admission.HeadroomShare(); h > 0 && !urgent && s.now().Sub(ms.lastUrgent) < UrgentMemory {
		// Work that should not wait is about: backlogs leave it room.
		lim.Keep, lim.KeepAtLeast = h, budget.Cost{Requests: 1, Tokens: ms.urgentCost}
		for i := range ms.units {
			lim.KeepAtLeast.Units[i] = 1
		}
	}
	if urgent {
		// An interactive job or a new flow may use the headroom, but only
		// for urgent work: no room is asked for the backlog behind it.
		return lim, budget.Cost{}
	}
	// Placements are monotone: a backlog planned far ahead would queue the
	// next interactive job behind it. It plans BacklogHorizon ahead; the
	// loop comes back at least every slice.
	lim.Horizon = BacklogHorizon
	n, _ := ms.sched.Len()
	backlog := budget.Cost{Requests: n, Tokens: ms.sched.Tokens()}
	if len(ms.units) > 0 || ms.splits {
		// The scheduler counts tokens only: the backlog's units (and
		// output) are the job's times the backlog.
		backlog.Output = c.Cost.Output * n
		if ms.splits {
			// Input as placed (net of warm prefixes), not as queued.
			backlog.Tokens = c.Cost.Tokens * n
		}
		for i := range ms.units {
			backlog.Units[i] = c.Cost.Units[i] * n
		}
	}
	return lim, backlog
}

// waitForBudget handles a job the model's budget refused: it goes back to
// the head of its queue and the model sleeps until the budget is expected
// to free, unless that is after the job's deadline: then it ends now,
// honestly, rather than wait in vain.
func (s *Service) waitForBudget(ctx context.Context, ms *modelState, it *Item, g leaseGrant) {
	c := it.Value.(*Candidate)
	now := s.now()
	wake := g.RetryAt
	if wake.Before(now) {
		wake = now
	}
	s.m.AdmissionWaits.WithLabelValues(c.Job.Provider, c.Job.Model, g.Reason).Inc()
	if dl := c.Job.Deadline; dl != nil && wake.After(*dl) {
		s.expire(ctx, c.Msg, c.Job, fmt.Sprintf("estimated wait %s for %s budget exceeds the deadline", wake.Sub(now).Round(time.Millisecond), g.Reason))
	} else {
		s.unpop(ms, it)
	}
	s.sleep(ms, wake, g.Reason)
}

// unpop returns it to the head of its model's queue.
func (s *Service) unpop(ms *modelState, it *Item) {
	ms.sched.Unpop(it)
	s.held.add(ms.key, it)
}

// sleep sets when ms looks at its budget again, and why its queue waits:
// within MaxWakeWait even if the estimate says later, as other processes
// may give budget back sooner.
func (s *Service) sleep(ms *modelState, wake time.Time, reason string) {
	if limit := s.now().Add(MaxWakeWait); wake.After(limit) {
		wake = limit
	}
	ms.wakeAt, ms.reason = wake, reason
}

// publish sends c to DISPATCH with its reservation: its cost on the
// model's schedule at the instant at, as planned at planned (its dispatch
// transit runs from there: lead.go).
func (s *Service) publish(ms *modelState, c *Candidate, at, planned time.Time, lim budget.Limits) *pub {
	now := s.now()
	j := c.Job
	j.Reservation = &job.Reservation{
		// The slice before the dash is what the executor settles against.
		ID: fmt.Sprintf("%d-0", s.store.SliceOf(at)), Requests: c.Cost.Requests, Tokens: c.Cost.Tokens,
		Output: c.Cost.Output, Cached: c.cached,
		ReservedAt: planned.UTC(), ValidUntil: at.Add(s.cfg.App.Admission.SendTolerance.D()).UTC(), SendAt: at.UTC(),
	}
	if len(ms.units) > 0 {
		j.Reservation.Units = make(map[string]int, len(ms.units))
		for k, name := range ms.units {
			j.Reservation.Units[name] = c.Cost.Units[k]
		}
	}
	if !lim.Limited() {
		// Unlimited: nothing to pace, so no instant to keep.
		j.Reservation.SendAt, j.Reservation.ValidUntil = time.Time{}, now.Add(s.cfg.App.Admission.DispatchGrace.D()).UTC()
	}
	j.Gated = true
	s.guard.Sign(j)
	s.m.TokensReserved.WithLabelValues(j.Provider, j.Model).Add(float64(c.Cost.Tokens))
	if len(j.Attempts) == 0 {
		s.m.QueueWait.WithLabelValues(string(j.Priority), s.cfg.App.TaskLabel(j.Task)).Observe(now.Sub(j.SubmittedAt).Seconds())
	}
	data, _ := json.Marshal(j)
	msg := nats.NewMsg(job.DispatchSubject(j.Provider, j.Model))
	msg.Data = data
	// One dispatch per QUEUE message: a redelivery of the same message (a
	// crash between publish and ack) is dropped by DISPATCH's duplicate
	// window, while a job re-admitted later is a new message.
	msg.Header.Set(jetstream.MsgIDHeader, keys.MsgID(keys.MsgDispatch, j.Tenant, j.ID, seqOf(c.Msg)))
	fut, err := s.mesh.JS.PublishMsgAsync(msg)
	if err != nil {
		s.log.Warn("dispatch publish failed", "job_id", j.ID, "err", err)
		_ = c.Msg.NakWithDelay(time.Second)
		return nil
	}
	ms.progressAt = now
	s.log.Debug("dispatched", "job_id", j.ID, "tenant", j.Tenant, "queued_for", now.Sub(j.SubmittedAt))
	return &pub{id: j.ID, msg: c.Msg, fut: fut}
}
