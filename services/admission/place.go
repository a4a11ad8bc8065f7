package admission

import (
	"cmp"
	"context"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// # Placement across a model's deployments
//
// A model name several providers serve is a group of deployments
// (internal/config); its jobs wait in one fair queue, and admission
// chooses each job's deployment when it places it: the lowest tier that
// can take it now, and within a tier the deployment expected to send it
// soonest (weight breaks ties, then the file's order). Deterministic: no
// random shuffle. A deployment whose schedule refuses the job sleeps until
// its budget is expected to free, and the next one is tried; the job
// waits at the head of the queue only when none can take it. A job that
// pins a deployment waits in that deployment's own queue. A job with an
// affinity key goes first to the deployment that served its key last
// (affinity.go) unless another would send it more than
// admission.cache_affinity.max_delay sooner.

// placer owns where and when a job may be sent: each deployment's state
// (models), which of a queue's deployments takes a job (candidates, cache
// affinity), the limits in effect on each (effective), and the instant its
// call may leave, leased in blocks of the deployment's schedule (lease).
// Each deployment's next possible send (next) is the later of its
// schedule's estimate and the fleet's health (a provider's pause is a
// cooling there): nothing else keeps a deployment out.
type placer struct {
	*env
	models   map[string]*modelState    // per budget key: a deployment's state
	leases   map[string]*budget.Lease  // per budget key: this process's blocks on the model's schedule
	lead     *budget.LeadEstimator     // learned from executors' transits (lead.go)
	health   DeploymentHealth          // nil: no deployment is blocked
	affinity *affinityTable            // affinity.go
	learn    *adapt.Store              // limits learned from the providers
	learned  *adapt.Cache[adapt.State] // per learn key: the record as last read
	shown    map[string]time.Time      // per budget key: the limit gauges last set
	inEffect sync.Map                  // per budget key: [2]int, the minute's requests and tokens in effect (seeing.go)
}

// DeploymentHealth is the fleet's view of each deployment's health: a
// deployment cooling after a 429 or a Retry-After, or skipped until a
// probe succeeds (a refused key, an unreachable endpoint, an open
// breaker). Blocked reports whether provider/model takes no jobs at now,
// until when (zero: until a probe succeeds) and why. internal/health
// provides it; admission never calls it with a lock held.
type DeploymentHealth interface {
	Blocked(provider, model string, now time.Time) (until time.Time, reason string, blocked bool)
}

// healthOf is h, or nil for a nil interface or one holding a nil pointer
// (a process without a health registry): nothing is blocked.
func healthOf(h DeploymentHealth) DeploymentHealth {
	if h == nil {
		return nil
	}
	if v := reflect.ValueOf(h); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil
	}
	return h
}

// reserve places the job it, popped from q in fair order, on the first
// deployment of q that takes it (candidates' order); when none can, it
// waits at the head of q (waitAll).
func (s *Service) reserve(ctx context.Context, q *queueState, it *Item) *pub {
	now := s.now()
	c := it.Value.(*Candidate)
	if c.wait.open {
		c.wait.placing = now
	}
	order, prev := s.placer.candidates(ctx, q, c, now)
	grouped := len(q.deps) > 1
	for _, ms := range order {
		p, out := s.reserveOn(ctx, q, ms, it, grouped)
		if out == refused {
			continue
		}
		if out == placed && c.Job.Affinity != "" && (grouped || s.app().Grouped(ms.model)) {
			s.placer.affinity.placed(c.Job, ms.provider, prev)
		}
		return p
	}
	s.waitAll(ctx, q, it)
	return nil
}

// candidates lists the deployments of q that may take c now, best first,
// and the provider c's affinity key was last served by ("": none).
// A deployment is left out until its next possible send (next): while it
// sleeps (its budget is expected to free later), or its health blocks it
// (a cooldown after the provider's Retry-After, a refused key, ...).
func (pl *placer) candidates(ctx context.Context, q *queueState, c *Candidate, now time.Time) (order []*modelState, prev string) {
	order = q.order[:0]
	for _, ms := range q.deps {
		if now.Before(pl.next(ms, now).look) {
			continue
		}
		if len(q.deps) > 1 && ms.tokenLimit > 0 && c.Job.Estimate != nil && c.Job.Estimate.Cost() > ms.tokenLimit {
			continue // never fits its minute (ingest checked it fits another)
		}
		order = append(order, ms)
	}
	q.order = order
	if len(q.deps) < 2 {
		return order, ""
	}
	slices.SortStableFunc(order, func(a, b *modelState) int {
		return cmp.Or(cmp.Compare(a.tier, b.tier), a.expected(now).Compare(b.expected(now)), cmp.Compare(b.weight, a.weight))
	})
	if c.Job.Affinity == "" || len(order) == 0 {
		return order, ""
	}
	return order, pl.affinity.stay(ctx, c.Job, order, now)
}

// expected is when ms is expected to send its next call at its pace, at
// the earliest now (an order, not a bound: paceAt).
func (ms *modelState) expected(now time.Time) time.Time {
	if ms.paceAt.After(now) {
		return ms.paceAt
	}
	return now
}

// advance moves ms's expected next send past a call placed at at: by the
// call's share of the limits in effect.
func (pl *placer) advance(ms *modelState, lim budget.Limits, c budget.Cost, at time.Time) {
	var d time.Duration
	if lim.RPM > 0 {
		d = time.Minute / time.Duration(lim.RPM)
	}
	if lim.TPM > 0 && c.Tokens > 0 {
		d = max(d, time.Duration(float64(time.Minute)*float64(c.Tokens)/float64(lim.TPM)))
	}
	ms.paceAt = latest(ms.paceAt, at).Add(d)
	pl.m.DeploymentPlaced.WithLabelValues(ms.provider, ms.model).Inc()
}

// firstWake is when the first deployment of q that waits is expected to
// take a job again (its next possible send: its budget free, its cooldown
// over), and why it waits until then.
func (pl *placer) firstWake(q *queueState, now time.Time) (time.Time, string) {
	var wake time.Time
	reason := ""
	for _, ms := range q.deps {
		n := pl.next(ms, now)
		if !n.at.After(now) {
			continue // not waiting (or one the job does not fit)
		}
		if wake.IsZero() || n.at.Before(wake) {
			wake, reason = n.at, n.reason
		}
	}
	if wake.IsZero() {
		wake = now.Add(minWake)
	}
	return wake, reason
}

// minWake is how soon a queue whose deployments all refused a job without
// saying until when looks again.
const minWake = 50 * time.Millisecond

// placeOn routes j to the deployment ms: a job of a group moves to it and
// is sealed again (the seal binds its provider; its estimate was verified
// when it was read from QUEUE).
func (pl *placer) placeOn(j *task.Task, ms *modelState) {
	if j.Provider == ms.provider {
		return
	}
	j.Provider = ms.provider
	pl.guard.Seal(j)
}

// latest is the latest of ts.
func latest(ts ...time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

// model returns the deployment provider/name.
func (pl *placer) model(provider, name string) *modelState {
	key := budget.ModelKey(provider, job.ModelToken(name))
	ms := pl.models[key]
	if ms == nil {
		ms = &modelState{key: key, provider: provider, model: name, weight: 1}
		if _, m, ok := pl.app().Deployment(provider, name); ok {
			ms.units, ms.unitLimits = m.UnitNames(), m.UnitLimits()
			ms.rule = m.Rule()
			ms.tier, ms.weight, ms.tokenLimit = m.Tier, m.Weight, m.TokenLimit()
		}
		pl.models[key] = ms
	}
	return ms
}

// nextSend is a deployment's next possible send: nothing is placed on
// it before at, for reason (a budget's bound, a day quota, health's
// verdict); look, at most at, is when this process tries it again, as
// other processes may give budget back before the estimate says. Zero:
// it may send now.
type nextSend struct {
	at, look time.Time
	reason   string
}

// reasonPaused is the wait reason of a deployment cooling after its
// provider's Retry-After: health's cooling (health.Cool, reason
// rate_limited) shows as a provider's pause, as `sluice queue` and
// GET /v1/jobs have always named it.
const reasonPaused = "paused_provider"

// next is ms's next possible send at now, computed here only: the later
// of its schedule's estimate (ms.refused, set when its budget refused a
// job) and health's verdict (cooling: until its wait ends; down: until a
// probe succeeds, looked at again every MaxWakeWait), with the reason of
// the later.
func (pl *placer) next(ms *modelState, now time.Time) nextSend {
	n := ms.refused
	if h, blocked := pl.verdict(ms, now); blocked {
		if !n.at.After(h.at) {
			n.at, n.reason = h.at, h.reason
		}
		n.look = latest(n.look, h.look)
	}
	if !n.at.After(now) && !n.look.After(now) {
		return nextSend{}
	}
	return n
}

// verdict is health's part of ms's next possible send at now: blocked
// says health keeps it out (internal/health decides; nil health keeps
// none out).
func (pl *placer) verdict(ms *modelState, now time.Time) (nextSend, bool) {
	if pl.health == nil {
		return nextSend{}, false
	}
	until, reason, blocked := pl.health.Blocked(ms.provider, ms.model, now)
	if !blocked {
		return nextSend{}, false
	}
	if until.IsZero() {
		until = now.Add(MaxWakeWait) // until a probe succeeds: look again then
	}
	if reason == "rate_limited" {
		reason = reasonPaused
	}
	return nextSend{at: until, look: until, reason: reason}, true
}
