// Package admission is Sluice's rate-aware dispatcher. It consumes QUEUE,
// re-validates each job (internal/guard), ends expired ones and sends a job
// whose not_before is in the future back to wait by JetStream redelivery
// delay, never in a sleeping goroutine. The rest it holds in memory, in one
// fair queue per model ([Scheduler]: deficit round robin over tenants by
// reserved tokens, then priority with floors within a tenant, new flows
// first), bounded in count and bytes, their messages kept alive. A model
// several providers serve has one queue, and each job is placed on one of
// its deployments (place.go; cache affinity: affinity.go, keyed by
// task.Task.Affinity).
//
// One loop per process pops jobs in fair order and passes each through the
// gates: its tenant's budgets, the model's per-day quota, then the model's
// paced schedule (internal/budget), each leased in blocks so the budget store
// is touched a few times a second, not per job; a later gate's refusal gives
// back what the earlier ones took. A placed job gets a signed reservation
// naming the instant its call may leave and goes to DISPATCH; a refused one
// goes back to the head of its queue until the budget is expected to free.
// A deployment takes no job before its next possible send, the later of
// its schedule's estimate and the fleet's health (internal/health: a
// provider's Retry-After cools it, a refused key takes it down; place.go);
// a watchdog gives back the held jobs of a model that dispatches nothing;
// a process that cannot reach the budget store lets its jobs go to one
// that can.
//
// Inside, [Service] wires small types, each the one owner of a decision:
// holder (hold.go: the jobs held here, their fair queues, and when they go
// back to JetStream), placer (place.go: which deployment takes a job,
// each deployment's next possible send, and the instant its call may
// leave), coster (correct.go: what a job
// reserves), gates (gate.go: the tenant's minute and day budgets and the
// model's day quota), spendGate (spend.go: the tenant's spend windows),
// waitBook (waits.go: why a job sent back to QUEUE waits, which jobs were
// cancelled), tracer (trace.go: a job's wait and placement in its trace),
// exits (expired and failed results) and outage (outage.go: a budget
// store out of reach), over a shared env (configuration, clock, mesh).
package admission

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/lane"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/promptcache"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Config is what admission needs.
type Config struct {
	App *config.Config
	// Live, when set, is the configuration in effect, which a reload
	// replaces (App is then its first value); nil: App, fixed.
	Live *config.Live
	Now  func() time.Time
	// Guard re-validates jobs read from QUEUE and signs reservations; nil:
	// Run makes one with the fleet key from the fleet bucket.
	Guard *guard.Guard
	// AckWait bounds how long a batch waits for DISPATCH to confirm its
	// publishes before the unconfirmed jobs go back to QUEUE (0:
	// mesh.PublishAckWait).
	AckWait time.Duration
	// LetGoAfter is how long the budget store may fail without a break
	// before this process stops keeping its held jobs, so that JetStream
	// hands them to a process that can reach it (0: LetGoAfter).
	LetGoAfter time.Duration
	// Calib corrects token estimates by what providers report (see
	// correct.go); nil: estimates are reserved as they are.
	Calib *calib.Table
	// HeldMax: see watchdog.go (0: HeldMax).
	HeldMax time.Duration
	// Health says which deployments the fleet skips for now (a cooldown
	// after a 429, a refused key, an open breaker): place.go; nil skips
	// none.
	Health DeploymentHealth
}

// Candidate is a job ready for a reservation.
type Candidate struct {
	Job  *task.Task
	Msg  jetstream.Msg
	Cost budget.Cost

	held    budget.Held // its parts as placed (correct.go, anthropic.go)
	counted bool        // already counted as demand
	touched time.Time   // last InProgress (or delivery)
	wait    waitTrace   // its wait as its trace shows it (trace.go)
	// The spend hold taken for this placement (spend.go): spendFresh goes
	// back if the job is not placed; spendNext is what it holds if it is.
	spendFresh, spendNext *task.SpendHold
}

// Service is the admission service: it wires the owned types the package
// doc names (New) and keeps the consume entry points: Run and the
// scheduler's loop (run.go), admit and check, dispatchAll and reserve, and
// reserve.go's reserveOn. It holds the owned types in named fields, not
// embedded, so that its method set is its own (internal/archtest): each
// call goes through the type that owns the decision (s.placer.lease,
// s.exits.expire).
type Service struct {
	*env
	holder    *holder
	placer    *placer
	coster    *coster
	gates     *gates
	spendGate *spendGate
	waitBook  *waitBook
	tracer    *tracer
	exits     *exits
	outage    *outage

	ackWait time.Duration
	failed  atomic.Value // why the scheduler stopped (string), "" while it runs
}

// env is what every part of admission shares: the configuration in
// effect, the clock, the mesh, the log and metrics, the guard and the
// models' schedule store. It decides nothing.
type env struct {
	live  *config.Live
	cfg   Config
	mesh  *mesh.Mesh
	store *budget.Store
	log   *slog.Logger
	m     *metrics.Set
	now   func() time.Time
	guard *guard.Guard
}

// New builds the service; it does no I/O.
func New(cfg Config, m *mesh.Mesh, log *slog.Logger, ms *metrics.Set) (*Service, error) {
	if cfg.Live != nil {
		cfg.App = cfg.Live.Load()
	} else if cfg.App != nil {
		cfg.Live = config.NewLive(cfg.App)
	}
	if cfg.App == nil {
		return nil, errors.New("admission: no configuration")
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	a := cfg.App.Admission
	st := budget.NewStore(m.Budgets, a.Params(), now)
	st.Writes = ms.BudgetWrites.Inc
	st.Conflicts = ms.BudgetConflict.Inc
	if so := a.ScheduleOwner; so.On() {
		o := budget.NewOwners(st, m.JS.Conn(), m.Budgets, log)
		o.Wait, o.Count = so.Wait.D(), func(p string, n int) { ms.BudgetOwner.WithLabelValues(p).Add(float64(n)) }
	}
	tmin := budget.NewStore(m.Budgets, a.TenantMinuteParams(), now)
	tday := budget.NewStore(m.Budgets, a.TenantDayParams(), now)
	for _, x := range []*budget.Store{tmin, tday} {
		x.Writes, x.Conflicts = ms.BudgetWrites.Inc, ms.BudgetConflict.Inc
	}
	s := newService(&env{live: cfg.Live, cfg: cfg, guard: cfg.Guard, mesh: m, store: st, log: log.With("service", "admission"), m: ms, now: now})
	s.placer.learn, s.placer.health = adapt.NewStore(m.Budgets, now), healthOf(cfg.Health)
	s.coster.pcache = promptcache.New(m.Budgets, now)
	s.gates.tenantMin, s.gates.tenantDay = tmin, tday
	s.spendGate.spend = budget.NewSpendLedger(m.Budgets, now)
	s.placer.affinity = newAffinityTable(m.Budgets, now, a.CacheAffinity.TTL.D(), a.CacheAffinity.MaxDelay.D(), ms.AffinityJobs)
	s.placer.lead = newLead(a)
	st.Lead = s.placer.lead.Lead
	s.ackWait = cmp.Or(cfg.AckWait, mesh.PublishAckWait)
	s.outage.letGo = cmp.Or(cfg.LetGoAfter, LetGoAfter)
	s.holder.heldMax = cmp.Or(cfg.HeldMax, HeldMax)
	return s, nil
}

// newService wires the owned types over e with their in-memory state;
// New adds what reaches the budgets bucket (tests build a Service
// without it).
func newService(e *env) *Service {
	tr := &tracer{env: e}
	x := &exits{env: e, tracer: tr}
	wb := &waitBook{waits: map[string]waitNote{}, cancelled: map[string]time.Time{}}
	pl := &placer{env: e, models: map[string]*modelState{}, leases: map[string]*budget.Lease{}, learned: adapt.NewCache[adapt.State](adapt.AdmissionRefresh), shown: map[string]time.Time{}}
	co := &coster{env: e}
	h := &holder{env: e, queues: map[string]*queueState{}, held: newHeldSet(), placer: pl, coster: co, tracer: tr, exits: x, waitBook: wb}
	gt := &gates{env: e, tblocks: map[string]*budget.Lease{}, tracer: tr, exits: x, waitBook: wb}
	s := &Service{env: e, holder: h, placer: pl, coster: co, gates: gt, waitBook: wb, tracer: tr, exits: x,
		spendGate: &spendGate{env: e, exits: x, gates: gt, coster: co}, outage: &outage{env: e, holder: h}}
	s.outage.budgetErr.Store("")
	s.failed.Store("")
	return s
}

// app is the configuration in effect (cfg.App for an env built
// without New, in tests).
func (e *env) app() *config.Config { return e.live.Or(e.cfg.App) }

// nextReload is closed by the next reload (never, without New).
func (e *env) nextReload() <-chan struct{} { return e.live.Next() }

// UnitQuantum is the per-second cap of a unit limited to limit per minute:
// limit x burst_fraction, rounded up (0: unlimited).
func UnitQuantum(limit int, burstFraction float64) int {
	if limit <= 0 {
		return 0
	}
	return max(int(math.Ceil(float64(limit)*burstFraction)), 1)
}

// effective returns the limits in effect for a model, reading the fleet's
// learned record at most every adapt.AdmissionRefresh.
func (pl *placer) effective(ctx context.Context, ms *modelState, model config.Model) adapt.Effective {
	ac := adapt.For(pl.app().Admission, model)
	lk := adapt.Key(ms.provider, job.ModelToken(ms.model))
	now := pl.now()
	st, _ := pl.learned.Last(lk)
	if ac.Adapts {
		var err error
		// The first read starts the record (it is made from the
		// configuration when the fleet has none).
		st, err = pl.learned.Get(lk, now, func(_ adapt.State, started bool) (adapt.State, error) {
			if !started {
				return pl.learn.Start(ctx, lk, ac)
			}
			st, _, err := pl.learn.Get(ctx, lk)
			return st, err
		})
		if err != nil {
			pl.log.Debug("learned limits", "key", lk, "err", err)
		}
	}
	e := adapt.Compute(ac, st, now)
	if now.Sub(pl.shown[ms.key]) >= adapt.AdmissionRefresh {
		// The gauges move with the record, the warm-up and the probe: a few
		// times a second is enough, not once per job.
		pl.shown[ms.key] = now
		pl.inEffect.Store(ms.key, [2]int{e.PerMinute[0], e.PerMinute[1]})
		for i, d := range []string{"requests_per_minute", "tokens_per_minute", "requests_per_second", "tokens_per_second"} {
			v := [4]int{e.PerMinute[0], e.PerMinute[1], e.PerSecond[0], e.PerSecond[1]}[i]
			pl.m.LimitEffective.WithLabelValues(ms.provider, ms.model, d).Set(float64(v))
		}
		if ms.rule.Split {
			pl.m.LimitEffective.WithLabelValues(ms.provider, ms.model, "output_tokens_per_minute").Set(float64(e.PerMinute[adapt.Output]))
			pl.m.LimitEffective.WithLabelValues(ms.provider, ms.model, "output_tokens_per_second").Set(float64(e.PerSecond[adapt.Output]))
		}
		// Units: configured, not adapted; the per-second quantum as
		// admission.burst_fraction derives it.
		for i, name := range ms.units {
			limit := ms.unitLimits[i]
			pl.m.LimitEffective.WithLabelValues(ms.provider, ms.model, name+"_per_minute").Set(float64(limit))
			pl.m.LimitEffective.WithLabelValues(ms.provider, ms.model, name+"_per_second").Set(float64(UnitQuantum(limit, pl.app().Admission.BurstFraction)))
		}
	}
	return e
}

// Ready reports whether admission can reach the budget store.
func (s *Service) Ready() error {
	if e := s.failed.Load().(string); e != "" {
		return fmt.Errorf("scheduler failed: %s", e)
	}
	if e := s.outage.budgetErr.Load().(string); e != "" {
		return fmt.Errorf("budget store: %s", e)
	}
	return nil
}

// admit takes a batch from QUEUE: expired jobs end, jobs not due yet wait
// in JetStream, the rest join their model's fair queue; then whatever the
// budgets allow is dispatched.
func (s *Service) admit(ctx context.Context, msgs []jetstream.Msg) {
	now := s.now()
	for _, msg := range msgs {
		if s.outage.lettingGo {
			// No budget store here: another process takes it.
			_ = msg.NakWithDelay(time.Second + jitter(time.Second))
			continue
		}
		j, ok := s.check(ctx, msg, now)
		if !ok {
			continue
		}
		if _, gone := s.waitBook.cancelled[j.Key()]; gone {
			_ = msg.Ack() // its caller cancelled it; its result is published
			continue
		}
		if j.Deadline != nil && !j.Deadline.After(now) {
			s.exits.expire(s.tracer.queuedCtx(ctx, msg), msg, j, "deadline passed while queued")
			continue
		}
		if j.NotBefore != nil && j.NotBefore.After(now) {
			if j.Deadline != nil && j.NotBefore.After(*j.Deadline) {
				s.exits.expire(s.tracer.queuedCtx(ctx, msg), msg, j, "the next attempt would start after the deadline")
				continue
			}
			if w := s.tracer.startWait(msg, now); w.open {
				w.note(tracing.ReasonNotBefore)
				s.tracer.endWait(&w, *j.NotBefore, tracing.ReasonNotBefore)
			}
			s.m.AdmissionWaits.WithLabelValues(j.Provider, j.Model, "not_before").Inc()
			s.waitBook.noteWait(j.Key(), notBeforeReason(j), *j.NotBefore)
			_ = msg.NakWithDelay(j.NotBefore.Sub(now))
			continue
		}
		if lane.Divert(ctx, s.mesh.JS, s.app(), msg, j, now, s.laneCount) {
			continue // to its model's batch lane (services/lane)
		}
		w := s.tracer.startWait(msg, now)
		if n, ok := s.waitBook.waits[j.Key()]; ok {
			w.note(n.reason) // why it was sent back to wait
		}
		delete(s.waitBook.waits, j.Key())
		s.holder.hold(&Candidate{Job: j, Msg: msg, wait: w}, now)
	}
	s.dispatchAll(ctx)
}

// check decodes and re-validates a job read from QUEUE (internal/guard):
// whoever published it, nothing in it is believed that the configuration
// and the fleet key do not confirm. A job that can never run ends failed
// (or, for a tenant Sluice does not know, is dropped) and ok is false.
func (s *Service) check(ctx context.Context, msg jetstream.Msg, now time.Time) (j *task.Task, ok bool) {
	poison := mesh.PoisonRule{Log: s.log, Stage: "queue", Count: func(stage, code string) { s.m.JobsRejected.WithLabelValues(stage, code).Inc() }}
	defer func() {
		// Whatever a message holds, it must not stop the scheduler.
		if p := recover(); p != nil {
			poison.Drop(msg, "invalid", fmt.Errorf("validation panicked: %v", p))
			j, ok = nil, false
		}
	}()
	j, err := mesh.DecodeTask(msg)
	if err != nil {
		poison.Drop(msg, mesh.CodeUndecodable, err)
		return nil, false
	}
	corrected, err := s.guard.Queued(j, now)
	if err == nil {
		if corrected {
			s.m.JobsRejected.WithLabelValues("queue", "estimate_recomputed").Inc()
			s.log.Warn("queue: estimate did not verify; recomputed from the request", "job_id", j.ID, "tokens", j.Estimate.Cost())
		}
		return j, true
	}
	var ve *job.ValidationError
	e := &job.Error{Code: job.CodeInvalidRequest, Message: err.Error()}
	if errors.As(err, &ve) {
		e = ve.AsError()
	}
	s.m.JobsRejected.WithLabelValues("queue", e.Code).Inc()
	if ve != nil && (ve.Code == job.CodeUnknownTenant || ve.Field == "id") {
		// Nothing is stored under a tenant Sluice does not know, nor
		// under an id that is no key.
		s.log.Warn("queue: invalid job dropped", "code", ve.Code, "field", ve.Field)
		_ = msg.Term()
		return nil, false
	}
	s.log.Warn("queue: invalid job ended", "job_id", j.ID, "code", e.Code)
	s.exits.fail(ctx, &Candidate{Job: j, Msg: msg, wait: s.tracer.startWait(msg, now)}, e)
	return nil, false
}

// BacklogHorizon is how far ahead work that may wait is placed on a
// model's schedule (urgent work may use admission.plan_horizon).
const BacklogHorizon = 750 * time.Millisecond

// OutputBurst is how far ahead of its average pace a model that limits
// output apart (Anthropic's OTPM) may place output (budget.Limits'
// OutputTolerance): a sixth of the bucket of a minute's worth the provider
// charges max_tokens from, room for the calls in flight whose unused output
// has not come back yet.
const OutputBurst = 10 * time.Second

// MaxWakeWait bounds how long a model's queue sleeps before it checks the
// budget again.
const MaxWakeWait = time.Second

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

// exits owns how admission ends a job: its terminal result (expired,
// failed) published through the mesh's one finish, then its QUEUE
// message acknowledged, or sent back to try again when the result could
// not be published.
type exits struct {
	*env
	tracer *tracer
}

func (x *exits) expire(ctx context.Context, msg jetstream.Msg, j *task.Task, why string) {
	res := mesh.Outcome{Status: job.StatusExpired, Error: &job.Error{Code: job.CodeDeadlineExpired, Message: why}}
	opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	if _, err := x.mesh.Finish(ctx, j, res, mesh.Exit{OpKey: opKey, Hints: mesh.ResultHints{Facts: mesh.FactsOf(j)}, Price: x.app()}); err != nil {
		_ = msg.NakWithDelay(time.Second)
		return
	}
	_ = msg.Ack()
}

func (x *exits) fail(ctx context.Context, c *Candidate, e *job.Error) {
	ctx = x.tracer.leave(ctx, c, "failed")
	j := c.Job
	res := mesh.Outcome{Status: job.StatusFailed, Error: e}
	opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	if _, err := x.mesh.Finish(ctx, j, res, mesh.Exit{OpKey: opKey, Hints: mesh.ResultHints{Facts: mesh.FactsOf(j)}, Price: x.app()}); err != nil {
		_ = c.Msg.NakWithDelay(time.Second)
		return
	}
	_ = c.Msg.Ack()
}

// watchDepth publishes QUEUE depth per priority as a metric.
func (s *Service) watchDepth(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		depth, err := QueueDepth(ctx, s.mesh.JS)
		if err != nil {
			continue
		}
		for _, p := range job.Priorities {
			s.m.QueueDepth.WithLabelValues(string(p), "all").Set(float64(depth[p]))
		}
	}
}

// QueueDepth counts the jobs waiting in QUEUE per priority.
func QueueDepth(ctx context.Context, js jetstream.JetStream) (map[job.Priority]int, error) {
	st, err := js.Stream(ctx, streams.Queue)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(job.QueuePrefix+">"))
	if err != nil {
		return nil, err
	}
	out := map[job.Priority]int{}
	for subj, n := range info.State.Subjects {
		parts := strings.Split(subj, ".")
		if len(parts) >= 3 {
			out[job.Priority(parts[2])] += int(n)
		}
	}
	return out, nil
}

// seqOf returns a message's stream sequence, for message ids that must be
// the same on redelivery and different for a new message.
func seqOf(msg jetstream.Msg) string {
	md, err := msg.Metadata()
	if err != nil {
		return job.NewID()
	}
	return fmt.Sprint(md.Sequence.Stream)
}

// Each model's schedule and each tenant window is leased the same way
// (budget.Lease): blocks of room taken with one compare-and-set and spent
// locally by the jobs that arrive while they last; what is left goes back to
// the shared window. On a model, blocks are room at planned send instants;
// blocks taken against the limits less the headroom may be spent by any
// job, blocks taken against the full limits for urgent jobs (interactive
// ones, new flows) only by them, so backlogged work never eats the headroom
// through a block.

// leaseChunks is how many pieces the predicted extra demand is asked in, so
// a partly full window still grants some of it.
const leaseChunks = 4

// demandChunks splits an expected extra demand into up to leaseChunks
// pieces of whole average jobs (each with its share of the tokens), so a
// partly full window grants some of it and what it grants fits jobs.
func demandChunks(d budget.Cost) []budget.Cost {
	if d.Requests <= 0 || d.Tokens <= 0 {
		return nil
	}
	return piecesOf(d, min(d.Requests, leaseChunks))
}

// piecesOf splits d into k equal pieces (k <= d.Requests).
func piecesOf(d budget.Cost, k int) []budget.Cost {
	piece := budget.Cost{Requests: d.Requests / k, Tokens: d.Tokens / k, Output: max(d.Output, 0) / k}
	for i, u := range d.Units {
		// Rounded up: a unit's amounts are small, and a piece with none
		// would fit no job that costs one.
		piece.Units[i] = (max(u, 0) + k - 1) / k
	}
	out := make([]budget.Cost, k)
	for i := range out {
		out[i] = piece
	}
	return out
}

// backlogChunks is how many average jobs of a backlog one lease asks room for.
const backlogChunks = 32

// leaseGrant is what lease admits: the first N candidates, each with the
// instant its call may leave and the instant that one was planned at (its
// dispatch transit runs from there: lead.go).
type leaseGrant struct {
	N       int
	SendAt  []time.Time
	From    []time.Time // the earliest each may leave (budget.Grant's From)
	Planned []time.Time
	Reason  string
	RetryAt time.Time
}

// lease admits the longest prefix of cands: first from this process's
// blocks, then by placing the rest on the model's schedule together with
// room for the backlog behind them (some of it) or the demand expected in
// the slice, which stays as blocks. One compare-and-set per backlogChunks
// jobs on a backlog, whatever the job rate. urgent says cands may spend
// the headroom (lim then has no Keep). An unlimited model is not paced and
// takes nothing from the store.
func (pl *placer) lease(ctx context.Context, key string, lim budget.Limits, cands []*Candidate, backlog budget.Cost, urgent bool) (leaseGrant, error) {
	now := pl.now()
	var g leaseGrant
	if !lim.Limited() {
		g.N, g.SendAt = len(cands), make([]time.Time, len(cands))
		for i := range g.SendAt {
			g.SendAt[i] = now
		}
		g.Planned, g.From = g.SendAt, g.SendAt
		return g, nil
	}
	l := pl.leases[key]
	if l == nil {
		l = budget.NewLease(pl.store, key)
		if ms := pl.models[key]; ms != nil && ms.rule.Split {
			// A bucket the provider refills (Anthropic): room given back
			// unspent rewinds the pace, at the configured limits (never
			// below those placed with, as ReturnRewind asks).
			if _, m, ok := pl.app().ModelRef(ms.model); ok {
				l.RewindReturns(m.Rule().Refill)
			}
		}
		pl.leases[key] = l
	}
	for _, c := range cands {
		// Demand is new arrivals: a job asking again after a wait is not
		// more demand.
		if c.counted {
			continue
		}
		c.counted = true
		if md, err := c.Msg.Metadata(); err == nil && md.NumDelivered > 1 {
			continue
		}
		l.Count(c.Cost, urgent, now)
	}
	// Spend the blocks while an executor can still reach their instant
	// (or be late by half the lead, within its tolerance).
	lead := pl.lead.Lead(now) / 2
	for _, c := range cands {
		b, ok := l.Spend(c.Cost, urgent, now, lead)
		if !ok {
			break
		}
		g.N++
		g.SendAt = append(g.SendAt, b.At)
		g.From = append(g.From, b.At)
		g.Planned = append(g.Planned, now)
	}
	rest := cands[g.N:]
	if len(rest) == 0 {
		return g, nil
	}
	// Place the rest, then room for the backlog behind them or the demand
	// expected for the rest of the slice.
	costs := make([]budget.Cost, 0, len(rest))
	var need budget.Cost
	for _, c := range rest {
		costs = append(costs, c.Cost)
		need = need.Plus(c.Cost)
	}
	var extra []budget.Cost
	var spread time.Duration
	if backlog.Requests > 0 {
		// Jobs wait behind these: ask for room for them too, one average
		// job per chunk (units rounded up), so what fits is spent locally
		// without more round trips.
		avg := budget.Cost{Requests: 1, Tokens: max(backlog.Tokens/backlog.Requests, 1), Output: backlog.Output / backlog.Requests}
		for i, u := range backlog.Units {
			avg.Units[i] = (u + backlog.Requests - 1) / backlog.Requests
		}
		for range min(backlog.Requests, backlogChunks) {
			extra = append(extra, avg)
		}
	} else {
		// Room for the demand expected in the slice (for urgent work too:
		// a dense interactive stream would otherwise cost a
		// compare-and-set per job), when it is dense enough (lead.go).
		spread = pl.store.Params().Slice
		extra = demandBlocks(l.Demand(urgent, now).Minus(need), spread)
	}
	tg, err := l.Take(ctx, lim, costs, extra, urgent, spread)
	if err != nil {
		return g, err
	}
	g.N += tg.N
	g.SendAt = append(g.SendAt, tg.SendAt...)
	g.From = append(g.From, tg.From...)
	for range tg.SendAt {
		g.Planned = append(g.Planned, tg.Planned)
	}
	g.Reason, g.RetryAt = tg.Reason, tg.RetryAt
	if g.N < len(cands) && g.Reason == "" {
		g.Reason, g.RetryAt = "burst", now.Add(pl.store.Params().Slice)
	}
	return g, nil
}

// returnLeases gives back what is left of blocks that can no longer be
// spent (or all of them, at shutdown), so the shared window shows only real
// use.
func (s *Service) returnLeases(ctx context.Context, all bool) {
	now := s.now()
	for _, l := range s.placer.leases {
		l.Expire(ctx, now, all)
	}
	for _, l := range s.gates.tblocks {
		// A day window's slice is a minute: its blocks go back at every
		// tick rather than hold other processes off for that long.
		l.Expire(ctx, now, all || l.Store().Params().Window > time.Minute)
	}
}
