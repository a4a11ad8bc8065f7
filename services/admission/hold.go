package admission

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// WhySubjectPrefix is the subject admission answers "why" on (see mesh).
const WhySubjectPrefix = mesh.WhySubjectPrefix

// KeepAliveEvery is how often held jobs tell JetStream they are still being
// worked on (the QUEUE consumer's ack wait is 30 s).
const KeepAliveEvery = 10 * time.Second

// holder owns the jobs this process holds: the fair queue each waits in
// (one per model group or pinned deployment), how many it may hold
// (evicting past admission.max_held), keeping them alive, why one waits,
// and handing them back to JetStream (expired, stalled: watchdog.go,
// cancelled: cancel.go, let go, released at shutdown).
type holder struct {
	*env
	queues   map[string]*queueState // per model group or pinned deployment: the jobs held for it
	held     heldSet                // the jobs in the models' queues (held.go)
	heldMax  time.Duration          // watchdog.go
	placer   *placer                // a queue's deployments (model), their limits in effect
	coster   *coster                // a held job's cost
	tracer   *tracer
	exits    *exits
	waitBook *waitBook
}

// queueState is one fair queue in this process: a model's, whose jobs may
// be placed on any deployment of its group (place.go), or, for jobs that
// pin a deployment of a group, that deployment's.
type queueState struct {
	key, model string
	sched      *Scheduler
	deps       []*modelState // where its jobs may go, in the group's preference order
	fair       fairMinute    // what its jobs' turns are charged against (fair.go)
	wakeAt     time.Time     // no deployment expected to take a job before
	reason     string        // why the queue waits now
	progressAt time.Time     // last dispatch, or when the queue was last empty (watchdog.go)
	order      []*modelState // place.go's scratch
}

// modelState is one deployment (provider/model) in this process: its
// schedule's state, shared by the queues that place jobs on it.
type modelState struct {
	key, provider, model string
	tier, weight         int
	// refused is its schedule's part of its next possible send: when the
	// schedule last refused a job here, the store's estimate of when its
	// budget frees, and why (reserve.go; zero once it places a job).
	// Health's part is health's (internal/health): placer.next combines
	// the two, and nothing else decides "not there, not now".
	refused nextSend
	// paceAt is when it is expected to send its next call at the pace of
	// the calls placed on it (placer.advance). It keeps nothing out: it
	// only orders a group's deployments (candidates).
	paceAt     time.Time
	tokenLimit int // its configured minute of tokens (0: none)
	// lastUrgent is when a job that should not wait last arrived (an
	// interactive job, or a new flow while others' backlogs wait);
	// urgentCost is the largest such job's cost since (reset after
	// UrgentMemory). While they are about, backlogged work leaves headroom.
	lastUrgent time.Time
	urgentCost int
	// units are the model's units in the budgets' index order (config:
	// sorted by name), and unitLimits their per-minute limits.
	units      []string
	unitLimits [budget.MaxUnits]int
	// rule is how the ledger counts the model's calls (budget.Rule: one
	// token limit, or input and output apart as Anthropic's).
	rule budget.Rule
}

// costOf is what job j reserves on this model's schedule: one request, its
// estimated tokens and its estimate of each of the model's units.
func (ms *modelState) costOf(j *task.Task) budget.Cost {
	return ms.rule.Cost(ms.rule.Claim(j.Estimate))
}

// UrgentMemory is how long after the last interactive or new-flow arrival
// backlogged work keeps leaving headroom. Short, because the headroom costs
// throughput while it goes unused (in the no-starvation benchmark, a whole
// benchmark's worth of 10 % after one new flow at the start, with two
// minutes); a job arriving after a longer quiet spell still goes first and
// waits at most for the next slice's expiries.
const UrgentMemory = 10 * time.Second

// Waiting says why a job has not been dispatched yet (mesh.Waiting).
type Waiting = mesh.Waiting

type whyQuery struct {
	id    string
	reply chan *Waiting
}

// queueOf returns the queue j waits in: its model group's, or, for a job
// that pins a deployment of a group (or a model one provider serves), the
// deployment's.
func (h *holder) queueOf(j *task.Task) *queueState {
	key := budget.ModelKey(j.Provider, job.ModelToken(j.Model))
	grouped := !j.Pinned && h.app().Grouped(j.Model)
	if grouped {
		key = groupKey(j.Model)
	}
	q := h.queues[key]
	if q == nil {
		a := h.app().Admission
		floors := map[job.Priority]float64{job.Standard: a.Floors.Standard, job.Batch: a.Floors.Batch}
		q = &queueState{key: key, model: j.Model}
		if grouped {
			for _, d := range h.app().Group(j.Model) {
				q.deps = append(q.deps, h.placer.model(d.Provider.Name, j.Model))
			}
		} else {
			q.deps = []*modelState{h.placer.model(j.Provider, j.Model)}
		}
		q.fair = h.fairMinuteOf(q.deps, a.Quantum)
		q.sched = NewScheduler(q.fair.quantum(a.Quantum), h.weight, floors, time.Minute)
		h.queues[key] = q
	}
	return q
}

// groupKey is the local key of a model group's queue: no budget key has
// its form.
func groupKey(model string) string { return "group " + model }

func (h *holder) weight(tenant string) int {
	if t, ok := h.app().Tenant(tenant); ok {
		return t.Weight
	}
	return 1
}

// hold queues a job in its model's scheduler, keeping memory bounded.
func (h *holder) hold(c *Candidate, now time.Time) {
	if old, ok := h.held.get(c.Job.Key()); ok && seqOf(old.c.Msg) == seqOf(c.Msg) {
		// JetStream redelivered a message we hold (its keep-alive was
		// late): keep one copy, acked through the newest delivery.
		old.c.Msg, old.c.touched = c.Msg, now
		return
	}
	q := h.queueOf(c.Job)
	h.coster.place(q.deps[0], c) // correct.go
	c.touched = now
	if n, _ := q.sched.Len(); n == 0 {
		q.progressAt = now // the watchdog's clock starts with the queue
	}
	// Interactive is the tenant's own word: only a sparse interactive job
	// (none of its tenant's waiting) may use the headroom, not a flood.
	urgent := (c.Job.Priority == job.Interactive && !q.sched.Waiting(c.Job.Tenant, job.Interactive)) || q.sched.IsNew(c.Job.Tenant)
	if urgent {
		// It should not wait behind backlogs: leave it headroom from now
		// on, and look at the budget now rather than at the model's wake.
		for _, ms := range q.deps {
			if now.Sub(ms.lastUrgent) > UrgentMemory {
				ms.urgentCost = 0
			}
			ms.lastUrgent, ms.urgentCost = now, max(ms.urgentCost, c.Cost.Tokens)
			ms.refused.look = time.Time{}
		}
		q.wakeAt = time.Time{}
	}
	it := &Item{Tenant: c.Job.Tenant, Priority: c.Job.Priority, Cost: c.Cost.Tokens, Charge: q.fair.charge(c.Cost), Size: len(c.Msg.Data()), Since: now, Value: c, Urgent: urgent}
	if c.Job.RateLimited > 0 {
		q.sched.PushFront(it)
	} else {
		q.sched.Push(it)
	}
	h.held.add(q.key, it)
	a := h.app().Admission
	for h.held.over(a.MaxHeld, a.MaxHeldBytes) {
		if !h.evict() {
			break
		}
	}
}

// evict sends the newest job of the largest backlog back to JetStream.
func (h *holder) evict() bool {
	var biggest *queueState
	for _, q := range h.queues {
		if n, _ := q.sched.Len(); n > 0 && (biggest == nil || n > func() int { m, _ := biggest.sched.Len(); return m }()) {
			biggest = q
		}
	}
	if biggest == nil {
		return false
	}
	it := biggest.sched.EvictTail()
	if it == nil {
		return false
	}
	h.held.remove(it)
	c := it.Value.(*Candidate)
	h.m.AdmissionWaits.WithLabelValues(c.Job.Provider, c.Job.Model, "evicted").Inc()
	h.tracer.leave(context.Background(), c, "evicted")
	_ = c.Msg.NakWithDelay(5*time.Second + jitter(5*time.Second))
	return true
}

// dispatchAll reserves and dispatches what each model's budget allows, in
// fair order, then waits for DISPATCH to confirm and acks QUEUE.
func (s *Service) dispatchAll(ctx context.Context) {
	now := s.now()
	batch := s.app().Admission.Batch
	var pending []*pub
	for _, q := range s.holder.queues {
		if n, _ := q.sched.Len(); n == 0 || now.Before(q.wakeAt) {
			continue
		}
		// One job at a time, in fair order: the scheduler's turn-taking
		// stays exact because a job the budget refuses goes straight back
		// to the head of its queue. Most are admitted from this process's
		// lease block without a round trip.
		for range batch {
			if s.now().Before(q.wakeAt) {
				break
			}
			it := q.sched.Pop(now)
			if it == nil {
				break
			}
			s.holder.held.remove(it)
			it.Value.(*Candidate).wait.note(q.reason)
			if p := s.reserve(ctx, q, it); p != nil {
				pending = append(pending, p)
			}
		}
	}
	if len(pending) == 0 {
		return
	}
	s.confirm(ctx, pending)
}

// confirm waits for DISPATCH to acknowledge each of pending and acks its
// QUEUE message. An acknowledgement that never comes (a stream leader lost
// with the message, a route cut without a close) must not stop the
// scheduler: what is unconfirmed is sent again every mesh.ResendEvery, with
// the same message id, so DISPATCH keeps one copy; after the ack wait it
// goes back to QUEUE, and DISPATCH's duplicate window drops the second
// copy if the first was stored.
func (s *Service) confirm(ctx context.Context, pending []*pub) {
	wait := time.NewTimer(s.ackWait)
	defer wait.Stop()
	resend := time.NewTicker(mesh.ResendEvery)
	defer resend.Stop()
	for _, p := range pending {
		for !p.answered {
			select {
			case <-p.fut.Ok():
				p.answered = true
				_ = p.msg.Ack()
			case err := <-p.fut.Err():
				s.refused(p, err)
			case <-resend.C:
				for _, q := range pending {
					s.sendAgain(q)
				}
			case <-wait.C:
				for _, q := range pending {
					if !s.heard(q) {
						s.dispatchFailed(q, jetstream.ErrAsyncPublishTimeout)
					}
				}
				return
			case <-ctx.Done():
				return
			}
		}
	}
}

// heard acts on p's acknowledgement if one came, and reports whether p is
// answered.
func (s *Service) heard(p *pub) bool {
	if p.answered {
		return true
	}
	select {
	case <-p.fut.Ok():
		_ = p.msg.Ack()
	case err := <-p.fut.Err():
		s.refused(p, err)
		return p.answered
	default:
		return false
	}
	p.answered = true
	return true
}

// refused acts on a refusal of p's last send. One no stream took (DISPATCH
// without a leader: no responders, a 503) leaves p unanswered, sent again
// at the next resend until the ack wait, so the job keeps its reservation
// and its QUEUE message through an election rather than going back to a
// QUEUE that may be electing too; any other sends the job back now.
func (s *Service) refused(p *pub, err error) {
	if mesh.NotTaken(err) {
		s.log.Debug("dispatch not taken; sent again while the ack wait lasts", "job_id", p.id, "err", err)
		return
	}
	p.answered = true
	s.dispatchFailed(p, err)
}

// sendAgain publishes p's dispatch again if it is not answered yet.
func (s *Service) sendAgain(p *pub) {
	if s.heard(p) {
		return
	}
	fut, err := s.mesh.JS.PublishMsgAsync(p.fut.Msg())
	if err != nil {
		s.log.Debug("dispatch sent again: publish failed", "job_id", p.id, "err", err)
		return
	}
	p.fut = fut
}

// dispatchFailed sends a job whose dispatch was not confirmed back to wait:
// its reservation is spent either way, and it tries again.
func (s *Service) dispatchFailed(p *pub, err error) {
	s.log.Warn("dispatch publish not confirmed; the job waits and tries again", "job_id", p.id, "err", err)
	_ = p.msg.NakWithDelay(time.Second)
}

// expireHeld ends held jobs whose deadline passed.
func (h *holder) expireHeld(ctx context.Context) {
	now := h.now()
	for _, q := range h.queues {
		gone := q.sched.Remove(func(it *Item) bool {
			dl := it.Value.(*Candidate).Job.Deadline
			return dl != nil && !dl.After(now)
		})
		for _, it := range gone {
			h.held.remove(it)
			c := it.Value.(*Candidate)
			c.wait.note(q.reason)
			h.exits.expire(h.tracer.leave(ctx, c, "expired"), c.Msg, c.Job, "deadline passed while waiting for "+orQueued(q.reason)+" budget")
		}
	}
	h.waitBook.forgetStaleWaits(now)
	h.waitBook.forgetCancelled(now)
}

// keepAlive extends the ack wait of held jobs.
func (h *holder) keepAlive() {
	now := h.now()
	for _, q := range h.queues {
		q.sched.Each(func(it *Item) bool {
			c := it.Value.(*Candidate)
			if now.Sub(c.touched) >= KeepAliveEvery {
				_ = c.Msg.InProgress()
				c.touched = now
			}
			return true
		})
	}
}

// letGoAll hands every held job back to JetStream, a little apart, and
// forgets it (LetGoAfter).
func (h *holder) letGoAll() {
	for _, q := range h.queues {
		for _, it := range q.sched.Remove(func(*Item) bool { return true }) {
			h.held.remove(it)
			h.tracer.leave(context.Background(), it.Value.(*Candidate), "let_go")
			_ = it.Value.(*Candidate).Msg.NakWithDelay(jitter(time.Second))
		}
		q.wakeAt = time.Time{}
	}
}

// releaseAll hands held jobs back to JetStream at shutdown, for another
// admission process to take at once.
func (h *holder) releaseAll() {
	for _, q := range h.queues {
		q.sched.Each(func(it *Item) bool {
			h.tracer.leave(context.Background(), it.Value.(*Candidate), "released")
			_ = it.Value.(*Candidate).Msg.Nak()
			return true
		})
	}
}

// why answers for a job this process knows about, by its key
// (task.Task.Key); nil otherwise.
func (h *holder) why(jobKey string) *Waiting {
	id := jobKey[strings.IndexByte(jobKey, '.')+1:]
	if hj, ok := h.held.get(jobKey); ok {
		// The tenant's own jobs only: how much others queue is theirs.
		w := h.heldWaiting(h.queues[hj.key], hj.c, h.now())
		w.JobID = id
		return w
	}
	if n, ok := h.waitBook.waits[jobKey]; ok {
		return &Waiting{JobID: id, Reason: n.reason, Until: n.until}
	}
	return nil
}

func orQueued(r string) string {
	if r == "" {
		return "queued"
	}
	return r
}

// untilWake is how long until the first model with jobs held expects its
// budget to free (its next placement comes within the horizon) before the
// next tick: a paced schedule stays continuous without waiting for ticks.
func (h *holder) untilWake() time.Duration {
	next := time.Time{}
	for _, q := range h.queues {
		if n, _ := q.sched.Len(); n > 0 && !q.wakeAt.IsZero() && (next.IsZero() || q.wakeAt.Before(next)) {
			next = q.wakeAt
		}
	}
	if next.IsZero() {
		return time.Hour
	}
	return max(time.Until(next), time.Millisecond)
}

// countHeld sets the held-jobs gauge per priority.
func (h *holder) countHeld() {
	for _, p := range job.Priorities {
		n := 0
		for _, q := range h.queues {
			n += q.sched.ClassLen(p)
		}
		h.m.Held.WithLabelValues(string(p)).Set(float64(n))
	}
}
