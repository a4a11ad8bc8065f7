// Package executor calls providers. It takes reserved jobs from DISPATCH
// (one durable consumer per provider/model), verifies their reservation,
// waits for the instant it names and sends within its tolerance or not at
// all, takes a concurrency slot only right before the network call, calls
// the provider once (no retries below it) and classifies the outcome. Then
// it publishes the terminal result, sends the job back to QUEUE with a
// not_before at least Retry-After away (a rate-limit refusal spends no
// attempt), falls back by route, or dead-letters it.
//
// The operation record is marked in_flight, with a sent mark, before the
// request leaves. A redelivery that finds a mark it did not write finds a call
// that may have reached the provider: it is not sent again blindly but ends
// outcome_unknown, unless the provider honours Idempotency-Key.
//
// Service consumes and dispatches; each decision on the way has one owner,
// a small type Service wires:
//
//   - caller (execute.go): whether an attempt's call leaves now, step by
//     step up to the call;
//   - outcomes (apply.go): the course a call's outcome takes;
//   - finisher (finish.go): publishing a job's terminal result;
//   - requeuer (requeue.go): sending a job back to admission unsent;
//   - marks (unknown.go): the operation record's in-flight mark, and what
//     becomes of a call whose outcome was lost;
//   - streamer (stream.go, resume.go): relaying a streamed answer;
//   - feedback (feedback.go): what calls teach the models' windows;
//   - epochCache (epoch.go): whether a paced call was planned before its
//     model's last limit cut;
//   - deployments (health.go): the executor's side of "don't send
//     there", which internal/health decides (its record, breakers,
//     credential quarantine and the pause of a deployment's dispatch);
//   - fallbacks (fallback.go): which target a route moves a job to;
//   - clientSet, tenantPools (live.go), transits (transit.go), waits
//     (why.go): the provider clients, the tenants' concurrency pools,
//     the paced calls' transits and where dispatched jobs wait.
package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/health"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/promptcache"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Config is what the executor needs.
type Config struct {
	App *config.Config
	// Live, when set, is the configuration in effect, which a reload
	// replaces (App is then its first value); nil: App, fixed.
	Live   *config.Live
	Getenv func(string) string // resolves providers' api_key_env
	Now    func() time.Time
	// Clients overrides the provider clients by provider name (tests).
	Clients map[string]provider.Client
	// Transport, when set, is used by every provider client (tests).
	Transport http.RoundTripper
	// Calib receives usage to calibrate token estimates; may be nil.
	Calib *calib.Table
	// Guard verifies dispatched jobs; nil: Run makes one with the fleet
	// key from the fleet bucket.
	Guard *guard.Guard
	// Cache stores complete answers of jobs that carry a cache target
	// (finish.go); nil: none are stored.
	Cache *cache.Cache
	// Health decides where not to send (health.go): the fleet's records,
	// which the executor writes, and this process's breakers and
	// credential quarantine. nil: New makes one of no deployments, which
	// writes no record.
	Health *health.Registry
}

// env is what every part of the executor reads: the configuration in
// effect, the mesh, the models' budget store, the log, the metrics and
// the clock. Each part embeds the one env its Service made.
type env struct {
	live   *config.Live
	cfg    Config
	mesh   *mesh.Mesh
	store  *budget.Store
	log    *slog.Logger
	m      *metrics.Set
	now    func() time.Time
	holder string       // this process's name in concurrency leases
	guard  *guard.Guard // set by New, or by Run before it consumes
}

// app is the configuration in effect (cfg.App for a Service built
// without New, in tests).
func (s *env) app() *config.Config { return s.live.Or(s.cfg.App) }

// nextReload is closed by the next reload (never, without New).
func (s *env) nextReload() <-chan struct{} { return s.live.Next() }

// Service is the executor service: it consumes DISPATCH, verifies each
// job and runs its attempt through the parts it wires (see the package
// doc).
type Service struct {
	*env

	// The parts it calls; wire makes them all.
	call     *caller
	out      *outcomes
	fin      *finisher
	back     *requeuer
	str      *streamer
	fb       *feedback
	epochs   *epochCache
	pools    *tenantPools
	transits *transits
	waits    *waits
}

// New builds the service; it does no I/O.
func New(cfg Config, m *mesh.Mesh, log *slog.Logger, ms *metrics.Set) (*Service, error) {
	if cfg.Live != nil {
		cfg.App = cfg.Live.Load()
	} else if cfg.App != nil {
		cfg.Live = config.NewLive(cfg.App)
	}
	if cfg.App == nil {
		return nil, errors.New("executor: no configuration")
	}
	if cfg.Getenv == nil {
		cfg.Getenv = func(string) string { return "" }
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	a := cfg.App.Admission
	st := budget.NewStore(m.Budgets, a.Params(), now)
	st.Writes, st.Conflicts = ms.BudgetWrites.Inc, ms.BudgetConflict.Inc
	if so := a.ScheduleOwner; so.On() {
		o := budget.NewOwners(st, m.JS.Conn(), m.Budgets, log)
		o.Wait, o.Count = so.Wait.D(), func(p string, n int) { ms.BudgetOwner.WithLabelValues(p).Add(float64(n)) }
	}
	e := &env{live: cfg.Live, cfg: cfg, mesh: m, store: st, log: log.With("service", "executor"), m: ms, now: now,
		holder: holderName(), guard: cfg.Guard}
	s := &Service{env: e}
	if cfg.Health == nil {
		// No fleet view (tests): a registry of no deployments writes no
		// record, and its breakers and quarantine decide for this process.
		e.cfg.Health = health.New(health.Config{KV: m.Budgets, Now: now, Log: e.log})
	}
	s.wire(adapt.NewStore(m.Budgets, now))
	s.pools.syncTenantPools(nil)
	return s, nil
}

// wire makes the service's parts and tells each the others it calls.
func (s *Service) wire(learn *adapt.Store) {
	e := s.env
	s.fin = &finisher{env: e}
	s.fb = &feedback{env: e, ledger: budget.NewLedger(e.store, e.log), pcache: promptcache.New(e.mesh.Budgets, e.now), learn: learn, seeded: map[string]time.Time{}}
	s.back = &requeuer{env: e, fin: s.fin, fb: s.fb}
	s.epochs = &epochCache{env: e, learn: learn, epochs: map[string]epochView{}}
	s.str = &streamer{env: e, fin: s.fin, fb: s.fb}
	mk := &marks{env: e, fin: s.fin, str: s.str, fb: s.fb}
	deps := &deployments{env: e, back: s.back}
	fall := &fallbacks{env: e, fin: s.fin, back: s.back, deps: deps}
	s.pools = &tenantPools{env: e, tenantPools: map[string]*budget.Pool{}}
	s.transits = &transits{env: e, wake: newWake(e.app().Admission.SendTolerance.D())}
	s.waits = &waits{}
	s.out = &outcomes{env: e, fin: s.fin, back: s.back, marks: mk, str: s.str, fb: s.fb, deps: deps, fall: fall,
		rnd: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))}
	s.call = &caller{env: e, fin: s.fin, back: s.back, marks: mk, str: s.str, epochs: s.epochs, deps: deps, fall: fall,
		clients: &clientSet{env: e, by: map[string]clientEntry{}}, pools: s.pools, transits: s.transits}
}

// poison is the executor's rule for a dispatched message that can never
// run (mesh.PoisonRule): dropped, counted as rejected at dispatch.
func (s *Service) poison() mesh.PoisonRule {
	return mesh.PoisonRule{Log: s.log, Stage: "dispatch", Count: func(stage, code string) { s.m.JobsRejected.WithLabelValues(stage, code).Inc() }}
}

// run executes a verified job. It returns nil when the message is to be
// acknowledged; a job that failed on its last allowed delivery is dead
// lettered first.
func (s *Service) run(ctx context.Context, msg jetstream.Msg, j *task.Task) error {
	err := s.execute(ctx, msg, j)
	var later redeliverAfter
	if err == nil || errors.As(err, &later) {
		return err
	}
	if md, merr := msg.Metadata(); merr == nil && md.NumDelivered >= MaxDeliveries {
		opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
		e := &job.Error{Code: "max_deliveries", Message: fmt.Sprintf("gave up after %d deliveries; last error: %v", md.NumDelivered, err)}
		if terr := s.fin.terminal(ctx, j, opKey, job.StatusDeadLettered, "max_deliveries", e); terr == nil {
			return nil
		}
	}
	return err
}

// verify checks a dispatched job before anything is spent on it (see
// internal/guard): a job that can never run ends failed; a reservation
// that does not verify sends the job back to admission, which checks it
// from scratch. It returns nil for a job to execute, errSettled or
// errTerminate when the message is done with, or an error to redeliver it.
func (s *Service) verify(ctx context.Context, msg jetstream.Msg, j *task.Task) error {
	err := s.guard.Dispatched(j)
	if err == nil {
		return nil
	}
	var ve *job.ValidationError
	switch {
	case errors.Is(err, guard.ErrUnverified):
		s.m.JobsRejected.WithLabelValues("dispatch", "unverified").Inc()
		s.log.Warn("dispatch: reservation does not verify; admitting the job again", "job_id", j.ID, "provider", clip.String(j.Provider, 64), "model", clip.String(j.Model, 64))
		if errors.Is(err, guard.ErrUnbounded) {
			// Admission signed it: what it holds goes back to the schedule.
			s.fb.giveBackUnsent(ctx, msg, j)
		}
		opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
		if err := s.back.requeue(ctx, msg, j, opKey, backUnverified); err != nil {
			return err
		}
	case errors.As(err, &ve) && (ve.Code == job.CodeUnknownTenant || ve.Field == "id"):
		// Nothing is stored under a tenant Sluice does not know, nor under
		// an id that is no key.
		s.m.JobsRejected.WithLabelValues("dispatch", ve.Code).Inc()
		s.log.Warn("dispatch: invalid job dropped", "code", ve.Code, "field", ve.Field)
		return errTerminate
	default:
		e := &job.Error{Code: job.CodeInvalidRequest, Message: err.Error()}
		if errors.As(err, &ve) {
			e = ve.AsError()
		}
		s.m.JobsRejected.WithLabelValues("dispatch", e.Code).Inc()
		s.log.Warn("dispatch: invalid job ended", "job_id", j.ID, "code", e.Code)
		opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
		if err := s.fin.finish(ctx, j, opKey, &mesh.Outcome{Status: job.StatusFailed, Error: e}); err != nil {
			return err
		}
	}
	return errSettled
}

// slotAhead is how long before its send instant a paced call takes its
// concurrency slot.
const slotAhead = 10 * time.Millisecond

// sleepUntil waits until t or ctx ends; it reports whether ctx is live.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// MaxDeliveries is how many times a dispatch is tried when the mesh itself
// fails (the job cannot be recorded or re-queued) before it is dead-lettered.
const MaxDeliveries = 10

// TenantSlotWait is how long a job whose tenant is at its concurrency cap
// waits before it is admitted again.
const TenantSlotWait = 250 * time.Millisecond

// ReconcileDelay is how long a non-interactive job whose last outcome is
// unknown waits before it retries with the same Idempotency-Key.
const ReconcileDelay = 5 * time.Second

// keepAlive tells JetStream the job is still being worked on while a call
// runs, so a long call is not redelivered to another executor: every
// keepAliveEvery until stop or the end of ctx. A timer, not a goroutine
// with a ticker: nearly every call ends before the first tick, and a
// goroutine per job was a cost of its own (issue 39).
func keepAlive(ctx context.Context, msg jetstream.Msg) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(keepAliveEvery, func() {
		if ctx.Err() != nil {
			return
		}
		_ = msg.InProgress()
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(keepAliveEvery)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// keepAliveEvery is how often keepAlive tells JetStream.
const keepAliveEvery = 10 * time.Second

// dispatchSeq is the DISPATCH stream sequence of msg: the same on a
// redelivery, so what the executor publishes for it is deduplicated.
func dispatchSeq(msg jetstream.Msg) string {
	md, err := msg.Metadata()
	if err != nil {
		return job.NewID()
	}
	return strconv.FormatUint(md.Sequence.Stream, 10)
}

// holderName identifies this process in concurrency leases.
func holderName() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", h, os.Getpid(), job.NewID()[24:])
}
