package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/job"
)

// pub is a dispatch published and not confirmed yet.
type pub struct {
	id       string
	msg      jetstream.Msg
	fut      jetstream.PubAckFuture // the last publish of the dispatch
	answered bool                   // acknowledged, or failed and put back
}

// outcome is what reserveOn did with a job.
type outcome int

const (
	placed  outcome = iota // published to DISPATCH (or settled trying)
	handled                // dealt with otherwise: deferred by a gate, ended, or back in its queue
	refused                // the deployment cannot take it now (it sleeps): try another
)

// reserveOn places the job it, popped from q in fair order, on the
// deployment ms: the job passes its gates (gate.go), takes room on the
// deployment's schedule (lease) and is published to DISPATCH with its
// reservation. soft says other deployments may take it instead: a refusal
// by this deployment's own day quota then refuses, rather than defers,
// the job.
func (s *Service) reserveOn(ctx context.Context, q *queueState, ms *modelState, it *Item, soft bool) (*pub, outcome) {
	c := it.Value.(*Candidate)
	s.coster.place(ms, c)                         // the correction now, not at arrival (correct.go)
	s.coster.netOfCache(ctx, ms, []*Candidate{c}) // anthropic.go
	_, model, ok := s.app().Deployment(ms.provider, ms.model)
	if !ok {
		s.exits.fail(ctx, c, &job.Error{Code: job.CodeUnknownModel, Message: fmt.Sprintf("model %q is no longer configured", ms.model)})
		return nil, handled
	}
	taken, passed, day, err := s.gates.passGatesOn(ctx, c, s.gates.gatesFor(c, ms.provider, model), soft)
	if err != nil {
		s.outage.storeDown(ms.key, err)
		s.unpop(q, it)
		s.sleepQueue(q, s.now().Add(time.Second), "budget_store")
		return nil, handled
	}
	if day != nil {
		c.wait.note(gateReason("model_day_", day.Reason))
		ms.refused = nextSend{at: day.RetryAt, look: day.RetryAt, reason: gateReason("model_day_", day.Reason)}
		if limit := s.now().Add(time.Minute); day.RetryAt.After(limit) {
			ms.refused.look = limit // another process may give the quota back
		}
		return nil, refused
	}
	if !passed {
		return nil, handled
	}
	placeable, err := s.spendGate.holdSpend(ctx, c, ms.provider, model) // spend.go
	if err != nil || !placeable {
		s.gates.giveBack(ctx, taken)
	}
	if err != nil {
		s.outage.storeDown(ms.key, err)
		s.unpop(q, it)
		s.sleepQueue(q, s.now().Add(time.Second), "budget_store")
		return nil, handled
	}
	if !placeable {
		return nil, handled
	}
	lim, backlog := s.limitsFor(ctx, q, ms, model, c, it.Urgent)
	g, err := s.placer.lease(ctx, ms.key, lim, []*Candidate{c}, backlog, it.Urgent)
	if err == nil && (len(g.SendAt) < g.N || len(g.Planned) < g.N || len(g.From) < g.N) {
		err = fmt.Errorf("lease granted %d jobs with %d send instants", g.N, len(g.SendAt))
	}
	if g.N == 0 {
		// The model cannot take the job now: what its gates and its spend
		// budget took goes back.
		s.gates.giveBack(ctx, taken)
	}
	if g.N == 0 || err != nil {
		s.spendGate.dropSpend(ctx, c)
	}
	if err != nil {
		// Fail closed: no budget, no dispatch.
		s.outage.storeDown(ms.key, err)
		s.unpop(q, it)
		s.sleepQueue(q, s.now().Add(time.Second), "budget_store")
		return nil, handled
	}
	s.outage.storeUp()
	if g.N == 0 {
		s.m.AdmissionWaits.WithLabelValues(ms.provider, ms.model, g.Reason).Inc()
		c.wait.note(g.Reason)
		wake := latest(g.RetryAt, s.now())
		if ms.rule.Split && (g.Reason == "burst" || g.Reason == "otpm") {
			// Calls that end give their unused output back and move the
			// pace back (budget.ReturnRewind) at any moment: look again
			// within a slice rather than at the instant the schedule
			// expected without them.
			if soon := s.now().Add(s.store.Params().Slice); soon.Before(wake) {
				wake = soon
			}
		}
		s.sleep(ms, g.RetryAt, wake, g.Reason)
		return nil, refused
	}
	ms.refused = nextSend{}
	q.wakeAt, q.reason = time.Time{}, ""
	s.placer.advance(ms, lim, c.Cost, g.SendAt[0]) // place.go
	return s.publish(q, ms, c, g.SendAt[0], g.From[0], g.Planned[0], lim), placed
}

// limitsFor is what c is placed against on ms: the limits in effect, with
// the headroom backlogged work leaves while urgent work is about, and the
// backlog behind c to ask room for with it.
func (s *Service) limitsFor(ctx context.Context, q *queueState, ms *modelState, model *config.Model, c *Candidate, urgent bool) (budget.Limits, budget.Cost) {
	eff := s.placer.effective(ctx, ms, *model)
	lim := eff.Limits()
	// Units are paced like requests and tokens at their configured limits
	// (not learned from the provider).
	lim.Units = ms.unitLimits
	if h := s.app().Admission.HeadroomShare(); h > 0 && !urgent && s.now().Sub(ms.lastUrgent) < UrgentMemory {
		// Work that should not wait is about: backlogs leave it room.
		lim.Keep, lim.KeepAtLeast = h, budget.Cost{Requests: 1, Tokens: ms.urgentCost}
		for i := range ms.units {
			lim.KeepAtLeast.Units[i] = 1
		}
	}
	if ms.rule.Split {
		lim.OutputTolerance = OutputBurst
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
	n, _ := q.sched.Len()
	backlog := budget.Cost{Requests: n, Tokens: q.sched.Tokens()}
	if len(ms.units) > 0 || ms.rule.Split {
		// The scheduler counts tokens only: the backlog's units (and
		// output) are the job's times the backlog.
		backlog.Output = c.Cost.Output * n
		if ms.rule.Split {
			// Input as placed (net of warm prefixes), not as queued.
			backlog.Tokens = c.Cost.Tokens * n
		}
		for i := range ms.units {
			backlog.Units[i] = c.Cost.Units[i] * n
		}
	}
	return lim, backlog
}

// waitAll handles a job no deployment of q can take now: it goes back to
// the head of q, which sleeps until the first of them is expected to take
// one, unless that is after the job's deadline: then it ends now,
// honestly, rather than wait in vain.
func (s *Service) waitAll(ctx context.Context, q *queueState, it *Item) {
	c := it.Value.(*Candidate)
	now := s.now()
	wake, reason := s.placer.firstWake(q, now) // place.go
	c.wait.note(reason)
	if dl := c.Job.Deadline; dl != nil && wake.After(*dl) {
		s.exits.expire(s.tracer.leave(ctx, c, "expired"), c.Msg, c.Job, fmt.Sprintf("estimated wait %s for %s exceeds the deadline", wake.Sub(now).Round(time.Millisecond), orQueued(reason)))
	} else {
		s.unpop(q, it)
	}
	s.sleepQueue(q, wake, reason)
}

// unpop returns it to the head of q.
func (s *Service) unpop(q *queueState, it *Item) {
	q.sched.Unpop(it)
	s.holder.held.add(q.key, it)
}

// sleep records that ms's budget refused a job for reason, expected to
// free at free: it looks at its budget again at wake, within MaxWakeWait
// even if the estimate says later, as other processes may give budget
// back sooner.
func (s *Service) sleep(ms *modelState, free, wake time.Time, reason string) {
	if limit := s.now().Add(MaxWakeWait); wake.After(limit) {
		wake = limit
	}
	ms.refused = nextSend{at: free, look: wake, reason: reason}
}

// sleepQueue sets when q tries its head job again, and why it waits,
// within MaxWakeWait.
func (s *Service) sleepQueue(q *queueState, wake time.Time, reason string) {
	if limit := s.now().Add(MaxWakeWait); wake.After(limit) {
		wake = limit
	}
	q.wakeAt, q.reason = wake, reason
}

// publish sends c to DISPATCH with its reservation: its cost on the
// model's schedule at the instant at, as planned at planned (its dispatch
// transit runs from there: lead.go). from, when before at, is the earliest
// the call may leave (the schedule had room for it from then).
func (s *Service) publish(q *queueState, ms *modelState, c *Candidate, at, from, planned time.Time, lim budget.Limits) *pub {
	now := s.now()
	j := c.Job
	s.placer.placeOn(j, ms) // place.go
	j.WaitReason = c.wait.last()
	c.held.Slice = s.store.SliceOf(at) // what the executor settles against
	j.Reservation = ms.rule.Reserve(c.held)
	j.Reservation.ReservedAt, j.Reservation.SendAt = planned.UTC(), at.UTC()
	j.Reservation.ValidUntil = at.Add(s.app().Admission.SendTolerance.D()).UTC()
	if from.Before(at) {
		j.Reservation.SendFrom = from.UTC()
	}
	if !lim.Limited() {
		// Unlimited: nothing to pace, so no instant to keep.
		j.Reservation.SendAt, j.Reservation.SendFrom, j.Reservation.ValidUntil = time.Time{}, time.Time{}, now.Add(s.app().Admission.DispatchGrace.D()).UTC()
	}
	j.Gated = true
	if c.spendNext != nil {
		j.SpendHold, c.spendFresh, c.spendNext = c.spendNext, nil, nil
	}
	s.guard.Sign(j)
	s.m.TokensReserved.WithLabelValues(j.Provider, j.Model).Add(float64(c.Cost.Tokens))
	if len(j.Attempts) == 0 {
		s.m.QueueWait.WithLabelValues(string(j.Priority), s.app().TaskLabel(j.Task)).Observe(now.Sub(j.SubmittedAt).Seconds())
	}
	data, _ := task.Encode(j)
	msg := nats.NewMsg(job.DispatchSubject(j.Provider, j.Model))
	msg.Data = data
	// One dispatch per QUEUE message: a redelivery of the same message (a
	// crash between publish and ack) is dropped by DISPATCH's duplicate
	// window, while a job re-admitted later is a new message.
	msg.Header.Set(jetstream.MsgIDHeader, keys.MsgID(keys.MsgDispatch, j.Tenant, j.ID, seqOf(c.Msg)))
	tracing.SpanToNATS(s.tracer.endPlacement(c, ms, now), msg.Header) // trace.go
	fut, err := s.mesh.JS.PublishMsgAsync(msg)
	if err != nil {
		s.log.Warn("dispatch publish failed", "job_id", j.ID, "err", err)
		_ = c.Msg.NakWithDelay(time.Second)
		return nil
	}
	q.progressAt = now
	s.log.Debug("dispatched", "job_id", j.ID, "tenant", j.Tenant, "queued_for", now.Sub(j.SubmittedAt))
	return &pub{id: j.ID, msg: c.Msg, fut: fut}
}
