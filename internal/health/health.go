// Package health decides where not to send: it keeps the fleet's one view
// of each deployment's health, and this process's breakers and credential
// quarantine (process.go). A deployment is a (provider, model) pair, the
// model named as callers name it; several providers may serve one model
// name (a group), and admission places each job on one of them.
//
// Each deployment has one record in the budgets bucket (keys.Health). An
// executor writes it when the provider tells it something about the
// deployment rather than the job: a Retry-After cools it until then (the
// longest wait wins, at most MaxPause) and pauses its dispatch
// (Config.Pause), a refused key (401, 403), an endpoint that cannot be
// reached, or an open breaker takes it down. Every process that places jobs watches the records and answers
// Blocked from memory, so admission's hot path never reads the bucket.
//
// When a cooling deployment's wait ends, or a down one's next probe is
// due, one process in the fleet takes the probe (a lease in the record,
// taken by compare-and-set): to it alone the deployment is open again, and
// the first call of it that succeeds (Up) opens it to everyone. A probe
// that fails writes the record again, which ends the lease; a lease nobody
// used lapses and another process takes it.
package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/breaker"
	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/pkg/job"
)

// State is what a record says of its deployment.
type State string

const (
	// Up: admission may place jobs on it (also what no record means).
	Up State = "up"
	// Cooling: the provider asked the fleet to wait until Until.
	Cooling State = "cooling"
	// Down: refused key, unreachable endpoint or open breaker; no job is
	// placed on it until a probe succeeds, and none is probed before Until.
	Down State = "down"
)

// Record is a deployment's health as the fleet shares it.
type Record struct {
	State State `json:"state"`
	// Reason says why it is cooling or down (rate_limited, auth_401,
	// unreachable, breaker_open, ...).
	Reason string `json:"reason,omitempty"`
	// Since is when it entered State: a call sent before then proves
	// nothing about it now.
	Since time.Time `json:"since"`
	// Until is the end of a cooling deployment's wait, or the earliest
	// probe of a down one.
	Until time.Time `json:"until,omitzero"`
	// Failures counts downs since it was last up; the wait before the next
	// probe doubles with each.
	Failures int `json:"failures,omitempty"`
	// Probe names the process that holds the probe, until ProbeUntil.
	Probe      string    `json:"probe,omitempty"`
	ProbeUntil time.Time `json:"probe_until,omitzero"`
}

// up reports whether r lets every process place jobs.
func (r Record) up() bool { return r.State == "" || r.State == Up }

// waiting reports whether r's wait has not ended at now.
func (r Record) waiting(now time.Time) bool { return now.Before(r.Until) }

// probedBy names the process that holds r's probe at now ("": none).
func (r Record) probedBy(now time.Time) string {
	if r.Probe != "" && now.Before(r.ProbeUntil) {
		return r.Probe
	}
	return ""
}

// Deployment names a provider's model, as callers name the model.
type Deployment struct{ Provider, Model string }

// Config is what a Registry needs.
type Config struct {
	// KV is the budgets bucket.
	KV jetstream.KeyValue
	// Deployments are the configured ones; records of others are ignored.
	Deployments []Deployment
	// Holder names this process in probe leases (unique in the fleet).
	Holder string
	Now    func() time.Time // nil: time.Now
	Log    *slog.Logger     // nil: discard
	// Changes counts the state changes this process writes (provider,
	// model, state); States is each deployment's state as this process
	// sees it (provider, model; 0 up, 1 cooling, 2 down). Either may be nil.
	Changes *prometheus.CounterVec
	States  *prometheus.GaugeVec
	// ProbeLease is how long a probe holder has before another process
	// may take the probe (default DefaultProbeLease).
	ProbeLease time.Duration
	// Breaker tunes this process's breakers (process.go); its Now is
	// Config.Now.
	Breaker breaker.Config
	// Pause, when set, is a Retry-After's effect beyond the record: it holds
	// the deployment's dispatch fleet-wide until until (mesh.PauseDispatch:
	// its DISPATCH consumer; admission reads the record). Pauses counts the
	// times it is run (provider, model); may be nil.
	Pause  func(ctx context.Context, provider, model string, until time.Time) error
	Pauses *prometheus.CounterVec
}

// Defaults.
const (
	// MaxPause bounds how long one Retry-After cools a deployment,
	// whatever it asked: past it, one process probes the deployment.
	MaxPause = 5 * time.Minute
	// DefaultProbeLease is short: the process that takes a probe may
	// have no job for the deployment (its fair queues hold others), and
	// until its lease lapses the rest of the fleet waits.
	DefaultProbeLease = 5 * time.Second
	// FirstBackoff is the wait before a down deployment's first probe; each
	// failed probe doubles it, up to MaxBackoff.
	FirstBackoff = time.Second
	MaxBackoff   = 30 * time.Second
)

type entry struct {
	rec Record
	rev uint64
}

// Registry is one process's view of every deployment's health, and its
// way to change it.
type Registry struct {
	cfg Config
	// The deployments kept (Set changes them on a reload).
	kmu    sync.RWMutex
	deps   []Deployment
	byKey  map[string]Deployment // keys.Health -> deployment
	keyOf  map[Deployment]string
	view   atomic.Pointer[map[Deployment]entry]
	mu     sync.Mutex // serialises changes to view
	probes chan Deployment
	asked  sync.Map // Deployment -> struct{}: a probe request is pending
	loaded chan struct{}
	once   sync.Once
	proc   process // this process's own evidence (process.go)
}

// New makes a registry; it does no I/O (Run watches the records).
func New(cfg Config) *Registry {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.ProbeLease <= 0 {
		cfg.ProbeLease = DefaultProbeLease
	}
	bc := cfg.Breaker
	bc.Now = cfg.Now
	r := &Registry{cfg: cfg, probes: make(chan Deployment, 64), loaded: make(chan struct{}),
		proc: process{breakers: breaker.NewSet(bc), broken: map[string]time.Time{}}}
	r.Set(cfg.Deployments)
	empty := map[Deployment]entry{}
	r.view.Store(&empty)
	return r
}

// Set makes ds the deployments the registry keeps: at start, and when a
// reload adds or removes some. A deployment added later starts up; its
// record, once one is written, is watched like the others.
func (r *Registry) Set(ds []Deployment) {
	byKey, keyOf := make(map[string]Deployment, len(ds)), make(map[Deployment]string, len(ds))
	for _, d := range ds {
		k := keys.Health(d.Provider, job.ModelToken(d.Model))
		byKey[k], keyOf[d] = d, k
	}
	r.kmu.Lock()
	for _, d := range ds {
		if _, known := r.keyOf[d]; !known && r.cfg.States != nil {
			r.cfg.States.WithLabelValues(d.Provider, d.Model).Set(0)
		}
	}
	r.deps, r.byKey, r.keyOf = slices.Clone(ds), byKey, keyOf
	r.kmu.Unlock()
}

// known returns the deployment whose record key is k.
func (r *Registry) known(k string) (Deployment, bool) {
	r.kmu.RLock()
	defer r.kmu.RUnlock()
	d, ok := r.byKey[k]
	return d, ok
}

// Blocked says whether admission must not place a job on the deployment at
// now, why, and until when (zero: until a probe succeeds). It reads memory
// only. When the deployment's wait has ended and no process holds its
// probe, Blocked asks Run to take it for this process and says to look
// again ProbeTakeWait later; while another process probes a deployment
// that was only cooling, ProbeRecheck later.
func (r *Registry) Blocked(provider, model string, now time.Time) (until time.Time, reason string, blocked bool) {
	d := Deployment{provider, model}
	e, ok := (*r.view.Load())[d]
	if !ok || e.rec.up() {
		return time.Time{}, "", false
	}
	if e.rec.waiting(now) {
		if e.rec.State == Cooling {
			return e.rec.Until, e.rec.Reason, true
		}
		return time.Time{}, e.rec.Reason, true
	}
	switch e.rec.probedBy(now) {
	case r.cfg.Holder:
		return time.Time{}, "", false // this process probes it
	case "":
		// Run takes the probe for this process in a moment (a
		// compare-and-set): look again then.
		r.askProbe(d)
		return now.Add(ProbeTakeWait), e.rec.Reason, true
	}
	if e.rec.State == Cooling {
		// Another process probes a deployment that only asked to wait:
		// its first success is likely, so look again soon.
		return now.Add(ProbeRecheck), e.rec.Reason, true
	}
	return time.Time{}, e.rec.Reason, true
}

// ProbeTakeWait is how long after Blocked asked to take a deployment's
// probe its caller should ask again; ProbeRecheck how long after it said
// another process probes a cooled deployment.
const (
	ProbeTakeWait = 25 * time.Millisecond
	ProbeRecheck  = 250 * time.Millisecond
)

// Get returns the deployment's record as this process last saw it.
func (r *Registry) Get(provider, model string) (Record, bool) {
	e, ok := (*r.view.Load())[Deployment{provider, model}]
	return e.rec, ok
}

func (r *Registry) askProbe(d Deployment) {
	if _, pending := r.asked.LoadOrStore(d, struct{}{}); pending {
		return
	}
	select {
	case r.probes <- d:
	default:
		r.asked.Delete(d)
	}
}

// Loaded is closed once Run has read every record that existed when it
// started.
func (r *Registry) Loaded() <-chan struct{} { return r.loaded }

// Run watches the records until ctx ends, and takes the probes Blocked
// asks for. It returns nil when ctx ends.
func (r *Registry) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := r.watch(ctx)
		if ctx.Err() != nil {
			break
		}
		r.cfg.Log.Warn("deployment health: watch ended; watching again", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

func (r *Registry) watch(ctx context.Context) error {
	w, err := r.cfg.KV.Watch(ctx, keys.HealthPrefix+">")
	if err != nil {
		return fmt.Errorf("watch %s>: %w", keys.HealthPrefix, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case d := <-r.probes:
			if _, err := r.TakeProbe(ctx, d.Provider, d.Model); err != nil {
				r.cfg.Log.Debug("deployment health: take probe", "provider", d.Provider, "model", d.Model, "err", err)
			}
			r.asked.Delete(d)
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("updates closed")
			}
			if e == nil {
				r.once.Do(func() { close(r.loaded) })
				continue
			}
			d, known := r.known(e.Key())
			if !known {
				continue
			}
			var rec Record
			if e.Operation() == jetstream.KeyValuePut {
				if json.Unmarshal(e.Value(), &rec) != nil {
					continue
				}
			}
			r.see(d, rec, e.Revision())
		}
	}
}

// see keeps rec (at rev) as d's record unless a later one is kept.
func (r *Registry) see(d Deployment, rec Record, rev uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.view.Load()
	if e, ok := old[d]; ok && e.rev >= rev {
		return
	}
	next := make(map[Deployment]entry, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[d] = entry{rec: rec, rev: rev}
	r.view.Store(&next)
	if r.cfg.States != nil {
		r.cfg.States.WithLabelValues(d.Provider, d.Model).Set(stateValue(rec))
	}
}

func stateValue(rec Record) float64 {
	switch rec.State {
	case Cooling:
		return 1
	case Down:
		return 2
	}
	return 0
}

// ErrUnknown: the deployment is not configured.
var ErrUnknown = errors.New("health: unknown deployment")

// update applies fn to d's record under compare-and-set and keeps what it
// wrote; fn returns false to leave the record as it is. It returns the
// record before and after, and whether it wrote.
func (r *Registry) update(ctx context.Context, d Deployment, fn func(*Record, time.Time) bool) (before, after Record, wrote bool, err error) {
	r.kmu.RLock()
	key, ok := r.keyOf[d]
	r.kmu.RUnlock()
	if !ok {
		return before, after, false, fmt.Errorf("%w: %s/%s", ErrUnknown, d.Provider, d.Model)
	}
	for range 20 {
		var rev uint64
		before = Record{}
		e, err := r.cfg.KV.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return before, before, false, fmt.Errorf("get %s: %w", key, err)
		default:
			rev = e.Revision()
			if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &before) != nil {
				before = Record{} // a corrupt record says nothing: start over
			}
		}
		after = before
		if !fn(&after, r.cfg.Now()) {
			return before, before, false, nil
		}
		data, _ := json.Marshal(after)
		var nrev uint64
		if rev == 0 {
			nrev, err = r.cfg.KV.Create(ctx, key, data)
		} else {
			nrev, err = r.cfg.KV.Update(ctx, key, data, rev)
		}
		if budget.IsConflict(err) {
			continue
		}
		if err != nil {
			return before, before, false, fmt.Errorf("write %s: %w", key, err)
		}
		r.see(d, after, nrev)
		return before, after, true, nil
	}
	return before, before, false, fmt.Errorf("write %s: too many conflicts", key)
}

// Cool makes the fleet wait until until, at most MaxPause from now,
// before it places another job on the deployment (a provider's
// Retry-After). The longest wait wins; a down deployment stays down (its
// probe waits at least as long). Each Cool also pauses the deployment's
// dispatch until then (Config.Pause).
func (r *Registry) Cool(ctx context.Context, provider, model string, until time.Time, why string) error {
	if limit := r.cfg.Now().Add(MaxPause); until.After(limit) {
		until = limit
	}
	r.pause(ctx, provider, model, until)
	if rec, ok := r.Get(provider, model); ok && !rec.up() && !until.After(rec.Until) {
		return nil // a wait as long is known (every refusal of a burst says so)
	}
	before, after, wrote, err := r.update(ctx, Deployment{provider, model}, func(rec *Record, now time.Time) bool {
		if !until.After(now) || !until.After(rec.Until) && !rec.up() {
			return false // not later than the wait already recorded
		}
		if rec.up() {
			rec.State, rec.Reason, rec.Since = Cooling, why, now
		}
		rec.Until, rec.Probe, rec.ProbeUntil = until, "", time.Time{}
		return true
	})
	if wrote {
		r.changed(provider, model, before, after)
	}
	return err
}

// Down takes the deployment down for reason (auth_401, unreachable,
// breaker_open, ...): no job is placed on it until a probe succeeds, and
// none is probed before notBefore nor before a wait that doubles with each
// failed probe. Calls that fail while it is already down and waiting
// change nothing but notBefore. A refused key (reason auth_*) also
// quarantines the provider's credential in this process (process.go).
func (r *Registry) Down(ctx context.Context, provider, model, reason string, notBefore time.Time) error {
	r.quarantine(provider, reason)
	if rec, ok := r.Get(provider, model); ok && rec.State == Down && rec.waiting(r.cfg.Now()) && !notBefore.After(rec.Until) {
		return nil // known down, and no probe due: every call in flight says so
	}
	before, after, wrote, err := r.update(ctx, Deployment{provider, model}, func(rec *Record, now time.Time) bool {
		if rec.State == Down && rec.waiting(now) {
			if !notBefore.After(rec.Until) {
				return false
			}
			rec.Until = notBefore
			return true
		}
		if rec.State != Down {
			rec.Since = now
		}
		rec.State, rec.Reason = Down, reason
		rec.Failures++
		rec.Until = now.Add(backoff(rec.Failures))
		if notBefore.After(rec.Until) {
			rec.Until = notBefore
		}
		rec.Probe, rec.ProbeUntil = "", time.Time{}
		return true
	})
	if wrote {
		r.changed(provider, model, before, after)
	}
	return err
}

func backoff(failures int) time.Duration {
	d := FirstBackoff
	for i := 1; i < failures && d < MaxBackoff; i++ {
		d *= 2
	}
	return min(d, MaxBackoff)
}

// Up reports that a call to the deployment sent at sent succeeded: a down
// deployment, or a cooling one whose wait has ended, is up again. A call
// sent before the deployment went down or began cooling proves nothing.
// It writes only when this process sees the deployment not up.
func (r *Registry) Up(ctx context.Context, provider, model string, sent time.Time) error {
	if rec, ok := r.Get(provider, model); !ok || rec.up() || sent.Before(rec.Since) {
		return nil
	}
	before, after, wrote, err := r.update(ctx, Deployment{provider, model}, func(rec *Record, now time.Time) bool {
		if rec.up() || sent.Before(rec.Since) || rec.State == Cooling && rec.waiting(now) {
			return false
		}
		*rec = Record{State: Up, Since: now}
		return true
	})
	if wrote {
		r.changed(provider, model, before, after)
	}
	return err
}

// TakeProbe takes the deployment's probe for this process when its wait
// has ended and no other process holds it; it reports whether this process
// holds it now.
func (r *Registry) TakeProbe(ctx context.Context, provider, model string) (bool, error) {
	_, after, _, err := r.update(ctx, Deployment{provider, model}, func(rec *Record, now time.Time) bool {
		if rec.up() || rec.waiting(now) {
			return false
		}
		if by := rec.probedBy(now); by != "" && by != r.cfg.Holder {
			return false
		}
		rec.Probe, rec.ProbeUntil = r.cfg.Holder, now.Add(r.cfg.ProbeLease)
		return true
	})
	if err != nil {
		return false, err
	}
	return !after.up() && after.Probe == r.cfg.Holder, nil
}

// changed logs and counts a state change this process wrote.
func (r *Registry) changed(provider, model string, before, after Record) {
	if before.State == after.State || before.up() && after.up() {
		return
	}
	state := after.State
	if state == "" {
		state = Up
	}
	if r.cfg.Changes != nil {
		r.cfg.Changes.WithLabelValues(provider, model, string(state)).Inc()
	}
	switch state {
	case Up:
		r.cfg.Log.Info("deployment up: a call succeeded", "provider", provider, "model", model, "was", before.State, "reason", before.Reason)
	case Cooling:
		r.cfg.Log.Info("deployment cooling: the provider asked to wait", "provider", provider, "model", model, "until", after.Until, "reason", after.Reason)
	default:
		r.cfg.Log.Warn("deployment down: no jobs are placed on it until a probe succeeds", "provider", provider, "model", model,
			"reason", after.Reason, "probe_at", after.Until, "failures", after.Failures)
	}
}

// DownNow lists the configured deployments this process sees down (not
// merely cooling), as "provider/model", sorted, and how many are
// configured: /readyz says a node is degraded while some are down and
// unready when all are.
func (r *Registry) DownNow() (down []string, configured int) {
	view := *r.view.Load()
	r.kmu.RLock()
	deps := r.deps
	r.kmu.RUnlock()
	for _, d := range deps {
		if e, ok := view[d]; ok && e.rec.State == Down {
			down = append(down, d.Provider+"/"+d.Model)
		}
	}
	slices.Sort(down)
	return down, len(deps)
}
