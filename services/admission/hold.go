package admission

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Subjects admission listens on (see mesh).
const (
	PauseSubjectPrefix = mesh.PauseSubjectPrefix
	WhySubjectPrefix   = mesh.WhySubjectPrefix
)

// KeepAliveEvery is how often held jobs tell JetStream they are still being
// worked on (the QUEUE consumer's ack wait is 30 s).
const KeepAliveEvery = 10 * time.Second

// modelState is one model's fair queue in this process.
type modelState struct {
	key, provider, model string
	sched                *Scheduler
	wakeAt               time.Time // budget expected to free; nothing to try before
	pausedUntil          time.Time // the provider asked the fleet to wait
	reason               string    // why the queue waits now
	progressAt           time.Time // last dispatch, or when the queue was last empty (watchdog.go)
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
	// splits: the model limits input and output tokens apart (anthropic.go);
	// cacheReads: its cache reads count toward the input limit.
	splits, cacheReads bool
}

// costOf is what job j reserves on this model's schedule: one request, its
// estimated tokens and its estimate of each of the model's units.
func (ms *modelState) costOf(j *job.Job) budget.Cost {
	c := budget.Cost{Requests: 1, Tokens: j.Estimate.Cost()}
	if ms.splits {
		c.Tokens, c.Output = j.Estimate.PromptTokens, j.Estimate.MaxTokens
	}
	for i, name := range ms.units {
		c.Units[i] = j.Estimate.Units[name]
	}
	return c
}

// UrgentMemory is how long after the last interactive or new-flow arrival
// backlogged work keeps leaving headroom. Short, because the headroom costs
// throughput while it goes unused (in the no-starvation benchmark, a whole
// benchmark's worth of 10 % after one new flow at the start, with two
// minutes); a job arriving after a longer quiet spell still goes first and
// waits at most for the next slice's expiries.
const UrgentMemory = 10 * time.Second

type pauseSignal struct {
	Provider string    `json:"provider"`
	Model    string    `json:"model"`
	Until    time.Time `json:"until"`
	Key      string    `json:"-"`
}

// Waiting says why a job has not been dispatched yet.
type Waiting struct {
	JobID    string    `json:"job_id"`
	Reason   string    `json:"reason"` // rpm, tpm, units, burst, tenant_*, paused_provider, not_before, budget_store, queued
	Until    time.Time `json:"until,omitzero"`
	Position int       `json:"position,omitempty"` // jobs of this model held ahead of it, roughly
}

type whyQuery struct {
	id    string
	reply chan *Waiting
}

func (s *Service) model(key string, j *job.Job) *modelState {
	ms := s.models[key]
	if ms == nil {
		a := s.cfg.App.Admission
		floors := map[job.Priority]float64{job.Standard: a.Floors.Standard, job.Batch: a.Floors.Batch}
		ms = &modelState{key: key, provider: j.Provider, model: j.Model,
			sched: NewScheduler(a.Quantum, s.weight, floors, time.Minute)}
		if _, m, ok := s.cfg.App.ModelRef(j.Model); ok {
			ms.units, ms.unitLimits = m.UnitNames(), m.UnitLimits()
			ms.splits, ms.cacheReads = m.SplitsOutput(), m.CacheReadsCount
		}
		s.models[key] = ms
	}
	return ms
}

func (s *Service) weight(tenant string) int {
	if t, ok := s.cfg.App.Tenant(tenant); ok {
		return t.Weight
	}
	return 1
}

// hold queues a job in its model's scheduler, keeping memory bounded.
func (s *Service) hold(c *Candidate, now time.Time) {
	if old, ok := s.held.get(c.Job.Key()); ok && seqOf(old.c.Msg) == seqOf(c.Msg) {
		// JetStream redelivered a message we hold (its keep-alive was
		// late): keep one copy, acked through the newest delivery.
		old.c.Msg, old.c.touched = c.Msg, now
		return
	}
	key := budget.ModelKey(c.Job.Provider, job.ModelToken(c.Job.Model))
	ms := s.model(key, c.Job)
	c.Cost = s.placedCost(ms, c.Job)
	c.touched = now
	if n, _ := ms.sched.Len(); n == 0 {
		ms.progressAt = now // the watchdog's clock starts with the queue
	}
	// Interactive is the tenant's own word: only a sparse interactive job
	// (none of its tenant's waiting) may use the headroom, not a flood.
	urgent := (c.Job.Priority == job.Interactive && !ms.sched.Waiting(c.Job.Tenant, job.Interactive)) || ms.sched.IsNew(c.Job.Tenant)
	if urgent {
		// It should not wait behind backlogs: leave it headroom from now
		// on, and look at the budget now rather than at the model's wake.
		if now.Sub(ms.lastUrgent) > UrgentMemory {
			ms.urgentCost = 0
		}
		ms.lastUrgent, ms.urgentCost = now, max(ms.urgentCost, c.Cost.Tokens)
		ms.wakeAt = time.Time{}
	}
	it := &Item{Tenant: c.Job.Tenant, Priority: c.Job.Priority, Cost: c.Cost.Tokens, Size: len(c.Msg.Data()), Since: now, Value: c, Urgent: urgent}
	if c.Job.RateLimited > 0 {
		ms.sched.PushFront(it)
	} else {
		ms.sched.Push(it)
	}
	s.held.add(key, it)
	a := s.cfg.App.Admission
	for s.held.over(a.MaxHeld, a.MaxHeldBytes) {
		if !s.evict() {
			break
		}
	}
}

// evict sends the newest job of the largest backlog back to JetStream.
func (s *Service) evict() bool {
	var biggest *modelState
	for _, ms := range s.models {
		if n, _ := ms.sched.Len(); n > 0 && (biggest == nil || n > func() int { m, _ := biggest.sched.Len(); return m }()) {
			biggest = ms
		}
	}
	if biggest == nil {
		return false
	}
	it := biggest.sched.EvictTail()
	if it == nil {
		return false
	}
	s.held.remove(it)
	c := it.Value.(*Candidate)
	s.m.AdmissionWaits.WithLabelValues(c.Job.Provider, c.Job.Model, "evicted").Inc()
	_ = c.Msg.NakWithDelay(5*time.Second + jitter(5*time.Second))
	return true
}

// dispatchAll reserves and dispatches what each model's budget allows, in
// fair order, then waits for DISPATCH to confirm and acks QUEUE.
func (s *Service) dispatchAll(ctx context.Context) {
	now := s.now()
	batch := s.cfg.App.Admission.Batch
	var pending []*pub
	for _, ms := range s.models {
		if n, _ := ms.sched.Len(); n == 0 || now.Before(ms.wakeAt) || now.Before(ms.pausedUntil) {
			continue
		}
		// One job at a time, in fair order: the scheduler's turn-taking
		// stays exact because a job the budget refuses goes straight back
		// to the head of its queue. Most are admitted from this process's
		// lease block without a round trip.
		for range batch {
			if s.now().Before(ms.wakeAt) {
				break
			}
			it := ms.sched.Pop(now)
			if it == nil {
				break
			}
			s.held.remove(it)
			if p := s.reserve(ctx, ms, it); p != nil {
				pending = append(pending, p)
			}
		}
	}
	if len(pending) == 0 {
		return
	}
	// An acknowledgement that never comes (a stream leader lost with the
	// message, a route cut without a close) must not stop the scheduler:
	// after the wait, what is unconfirmed goes back to QUEUE, and DISPATCH's
	// duplicate window drops the second copy if the first was stored.
	wait := time.NewTimer(s.ackWait)
	defer wait.Stop()
	late := false
	for _, p := range pending {
		if !late {
			select {
			case <-p.fut.Ok():
				_ = p.msg.Ack()
				continue
			case err := <-p.fut.Err():
				s.dispatchFailed(p, err)
				continue
			case <-wait.C:
				late = true
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-p.fut.Ok():
			_ = p.msg.Ack()
		case err := <-p.fut.Err():
			s.dispatchFailed(p, err)
		default:
			s.dispatchFailed(p, jetstream.ErrAsyncPublishTimeout)
		}
	}
}

// dispatchFailed sends a job whose dispatch was not confirmed back to wait:
// its reservation is spent either way, and it tries again.
func (s *Service) dispatchFailed(p *pub, err error) {
	s.log.Warn("dispatch publish not confirmed; the job waits and tries again", "job_id", p.id, "err", err)
	_ = p.msg.NakWithDelay(time.Second)
}

// expireHeld ends held jobs whose deadline passed.
func (s *Service) expireHeld(ctx context.Context) {
	now := s.now()
	for _, ms := range s.models {
		gone := ms.sched.Remove(func(it *Item) bool {
			dl := it.Value.(*Candidate).Job.Deadline
			return dl != nil && !dl.After(now)
		})
		for _, it := range gone {
			s.held.remove(it)
			c := it.Value.(*Candidate)
			s.expire(ctx, c.Msg, c.Job, "deadline passed while waiting for "+orQueued(ms.reason)+" budget")
		}
	}
	for id, at := range s.notBefore {
		if now.After(at.Add(time.Minute)) {
			delete(s.notBefore, id)
		}
	}
}

// keepAlive extends the ack wait of held jobs.
func (s *Service) keepAlive() {
	now := s.now()
	for _, ms := range s.models {
		ms.sched.Each(func(it *Item) bool {
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
func (s *Service) letGoAll() {
	for _, ms := range s.models {
		for _, it := range ms.sched.Remove(func(*Item) bool { return true }) {
			s.held.remove(it)
			_ = it.Value.(*Candidate).Msg.NakWithDelay(jitter(time.Second))
		}
		ms.wakeAt = time.Time{}
	}
}

// releaseAll hands held jobs back to JetStream at shutdown, for another
// admission process to take at once.
func (s *Service) releaseAll() {
	for _, ms := range s.models {
		ms.sched.Each(func(it *Item) bool {
			_ = it.Value.(*Candidate).Msg.Nak()
			return true
		})
	}
}

// why answers for a job this process knows about, by its key
// (job.Job.Key); nil otherwise.
func (s *Service) why(jobKey string) *Waiting {
	id := jobKey[strings.IndexByte(jobKey, '.')+1:]
	if hj, ok := s.held.get(jobKey); ok {
		ms := s.models[hj.key]
		w := &Waiting{JobID: id, Reason: orQueued(ms.reason), Until: ms.wakeAt}
		if s.now().Before(ms.pausedUntil) {
			w.Reason, w.Until = "paused_provider", ms.pausedUntil
		}
		w.Position, _ = ms.sched.Len()
		return w
	}
	if at, ok := s.notBefore[jobKey]; ok {
		return &Waiting{JobID: id, Reason: "not_before", Until: at}
	}
	return nil
}

func orQueued(r string) string {
	if r == "" {
		return "queued"
	}
	return r
}
