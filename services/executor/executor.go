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
package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/breaker"
	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/health"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/promptcache"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/route"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/streams"
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
	// (cache.go); nil: none are stored.
	Cache *cache.Cache
	// Health is the fleet's view of deployments' health, which the
	// executor writes (health.go); nil: not written.
	Health *health.Registry
}

// Service is the executor service.
type Service struct {
	live   *config.Live
	pcache *promptcache.Registry // warm prompt prefixes (anthropic.go)
	// warming holds, per learn key, whether its last cut is being read
	// ahead of a paced call (transit.go).
	warming sync.Map
	// Writes to models' schedules, coalesced per key (settle.go): plain
	// give-backs, lapsed instants, bucket providers' give-backs, charges.
	backs, lapses coalesce[budget.Return]
	refunds       coalesce[rewound]
	charges       coalesce[budget.Settlement]
	transits      transits // paced calls' dispatch transits, to report (transit.go)
	guard         *guard.Guard
	cfg           Config
	mesh          *mesh.Mesh
	store         *budget.Store
	log           *slog.Logger
	m             *metrics.Set
	now           func() time.Time
	clients       clientSet // live.go
	rndMu         sync.Mutex
	rnd           *rand.Rand
	holder        string // this process's name in concurrency leases

	poolMu      sync.Mutex
	tenantPools map[string]*budget.Pool // live.go
	routes      atomic.Pointer[routedBy]
	breakers    *breaker.Set
	seedMu      sync.Mutex
	seeded      map[string]time.Time
	brokenMu    sync.Mutex
	broken      map[string]time.Time // provider -> credential refused until
	learn       *adapt.Store
	epochMu     sync.Mutex
	epochs      map[string]epochView // learn key -> last cut, as last read
	running     cancels              // streamed jobs in this process, for cancellation
	waits       sync.Map             // job key -> mesh.Waiting: dispatched jobs waiting here (why.go)
	ended       sync.Map             // job id -> true: its stream's end marker is published
	firstToken  sync.Map             // job key -> time.Duration: its stream's time to first token (request log)
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
	s := &Service{live: cfg.Live, cfg: cfg, mesh: m, store: st, log: log.With("service", "executor"), m: ms, now: now,
		clients: clientSet{by: map[string]clientEntry{}}, rnd: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7)),
		holder: holderName(), broken: map[string]time.Time{}, seeded: map[string]time.Time{},
		learn: adapt.NewStore(m.Budgets, now), epochs: map[string]epochView{}, pcache: promptcache.New(m.Budgets, now),
		breakers: breaker.NewSet(breaker.Config{Now: now})}
	s.guard = cfg.Guard
	s.tenantPools = map[string]*budget.Pool{}
	s.syncTenantPools(nil) // live.go
	return s, nil
}

// app is the configuration in effect (cfg.App for a Service built
// without New, in tests).
func (s *Service) app() *config.Config {
	if s.live == nil {
		return s.cfg.App
	}
	return s.live.Load()
}

// nextReload is closed by the next reload (never, without New).
func (s *Service) nextReload() <-chan struct{} {
	if s.live == nil {
		return nil
	}
	return s.live.Next()
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
		if terr := s.terminal(ctx, j, opKey, job.StatusDeadLettered, "max_deliveries", e); terr == nil {
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
			s.giveBackUnsent(ctx, msg, j)
		}
		opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
		if err := s.requeue(ctx, msg, j, opKey, backUnverified); err != nil {
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
		if err := s.finish(ctx, j, opKey, &mesh.Outcome{Status: job.StatusFailed, Error: e}); err != nil {
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

// epochRefresh is how stale this process's view of a model's last cut may
// be when it decides whether to drain a call.
const epochRefresh = 100 * time.Millisecond

type epochView struct {
	epoch int64 // unix ms of the last cut
	read  time.Time
}

// drained reports whether the model's limits were cut after j was planned
// (plus the time admission takes to see a cut): such a call was paced at a
// rate the provider refused, and sending it would likely draw another 429.
func (s *Service) drained(ctx context.Context, j *task.Task) bool {
	key := adapt.Key(j.Provider, job.ModelToken(j.Model))
	s.epochMu.Lock()
	v := s.epochs[key]
	s.epochMu.Unlock()
	if now := s.now(); now.Sub(v.read) >= epochRefresh {
		var err error
		if v, err = s.readEpoch(ctx, key, now); err != nil {
			return false
		}
	}
	return v.epoch > 0 && j.Reservation.ReservedAt.UnixMilli() < v.epoch+adapt.AdmissionRefresh.Milliseconds()
}

// readEpoch reads the model's last cut (learn key) at now and keeps it.
func (s *Service) readEpoch(ctx context.Context, key string, now time.Time) (epochView, error) {
	st, _, err := s.learn.Get(ctx, key)
	if err != nil {
		return epochView{}, err
	}
	v := epochView{epoch: st.Epoch, read: now}
	s.epochMu.Lock()
	s.epochs[key] = v
	s.epochMu.Unlock()
	return v, nil
}

// requeueOp marks an operation that was about to be called queued again
// (it goes back to admission instead); a missing record is fine.
func (s *Service) requeueOp(ctx context.Context, opKey string, j *task.Task, why string) {
	if _, err := s.mesh.UpdateOp(ctx, opKey, func(r *mesh.OpRecord) bool {
		if r.State != mesh.OpInFlight {
			return false
		}
		r.State, r.Sent = mesh.OpQueued, nil
		return true
	}); err != nil && !errors.Is(err, job.ErrNotFound) {
		s.log.Debug(why+": op record", "job_id", j.ID, "err", err)
	}
}

// giveBackUnsent returns to the model's schedule what a verified, paced
// reservation planned at its instant, when this executor lets it lapse
// without a call (late for the instant, or no slot in time): the provider
// never saw it, and kept, it would push the job's next plan behind its own
// lapsed one (on a model allowed one request a minute, by a minute). Only
// on a dispatch's first delivery: a redelivered one may have been sent by
// an executor that died before acknowledging it.
func (s *Service) giveBackUnsent(ctx context.Context, msg jetstream.Msg, j *task.Task) {
	r := j.Reservation
	if r == nil || r.SendAt.IsZero() {
		return
	}
	if md, err := msg.Metadata(); err != nil || md.NumDelivered != 1 {
		return
	}
	_, model, ok := s.app().Deployment(j.Provider, j.Model)
	if !ok {
		return
	}
	key := budget.ModelKey(j.Provider, job.ModelToken(j.Model))
	// Coalesced per model (settle.go): one write for what lapses meanwhile.
	back := budget.Cost{Requests: r.Requests, Tokens: r.Tokens, Output: r.Output, Units: reservedUnits(r, model)}
	if model.SplitsOutput() {
		// A bucket the provider refills (Anthropic, as settleSplit):
		// what it never saw rewinds the pace, whatever was placed after.
		s.rewindBack(ctx, key, r.SendAt, back, budget.Limits{RPM: model.RPM, TPM: model.TokenLimit(), OTPM: model.OTPM})
		return
	}
	s.giveBack(ctx, key, r.SendAt, back, true)
}

// throttled handles a rate-limit refusal of a call Sluice admitted: that is
// Sluice's misjudgement, not the job's. The limits in effect learn from it
// (at most one cut per epoch), the window gives back the tokens the
// provider did not charge, and the job goes back to admission, keeping its
// place in its tenant's queue and spending none of its attempts; only its
// deadline, or admission.max_rate_limited refusals, end it.
func (s *Service) throttled(ctx context.Context, msg jetstream.Msg, j *task.Task, opKey string, info provider.RateLimitInfo, start time.Time, elapsed time.Duration) error {
	key := budget.ModelKey(j.Provider, job.ModelToken(j.Model))
	if _, model, ok := s.app().Deployment(j.Provider, j.Model); ok && j.Reservation != nil {
		used, _ := s.store.Used(ctx, key)
		var recent budget.Cost
		if !j.Reservation.SendAt.IsZero() {
			recent, _ = s.store.Recent(ctx, key, j.Reservation.SendAt, budget.Cost{Requests: j.Reservation.Requests, Tokens: j.Reservation.Tokens})
		}
		dim := -1
		switch info.Dimension {
		case "requests":
			dim = adapt.Requests
		case "tokens":
			dim = adapt.Tokens
		case "output_tokens":
			dim = adapt.Output
		}
		cut, reason, err := s.learn.Cut(ctx, adapt.Key(j.Provider, job.ModelToken(j.Model)), adapt.For(s.app().Admission, *model), adapt.Refusal{
			Kind: info.Kind, Dim: dim, ReservedAt: j.Reservation.ReservedAt, RetryAfter: info.RetryAfter,
			Stated: [adapt.Dims]int{info.StatedLimitRequests, info.StatedLimitTokens, info.StatedLimitOutput}, Used: used, Recent: recent,
			Cost: budget.Cost{Requests: j.Reservation.Requests, Tokens: j.Reservation.Tokens, Output: j.Reservation.Output}})
		if err != nil {
			s.log.Warn("learn from 429", "err", err)
		}
		if cut {
			s.m.LimitCuts.WithLabelValues(j.Provider, j.Model, reason).Inc()
			s.log.Info("limits cut", "provider", j.Provider, "model", j.Model, "reason", reason)
		}
		// The provider charged the request but none of its tokens, nor
		// of its other units (nothing was generated).
		back := budget.Cost{Tokens: j.Reservation.Tokens, Output: j.Reservation.Output, Units: reservedUnits(j.Reservation, model)}
		if !j.Reservation.SendAt.IsZero() && back.Positive() {
			s.giveBack(ctx, key, j.Reservation.SendAt, back, false)
		}
	}
	j.RateLimited++
	capped := j.RateLimited > s.app().Admission.MaxRateLimited
	if capped {
		// Where the retry policy used to give up on a 429, the cap does: a
		// route may move the job (rate_limit_after_retry_budget,
		// batch_low_priority) before it is dead-lettered.
		sit := route.Situation{Current: config.Target{Provider: j.Provider, Model: j.Model}, Priority: string(j.Priority),
			LastClass: provider.Retry, RetryBudgetExhausted: true}
		if fb, ok := s.fallback(j, sit); ok {
			return s.reroute(ctx, msg, j, opKey, fb)
		}
		s.m.RateLimitRequeues.WithLabelValues(j.Provider, j.Model, "cap").Inc()
		j.Attempts = append(j.Attempts, job.Attempt{N: len(j.Attempts) + 1, Provider: j.Provider, Model: j.Model, StartedAt: start.UTC(),
			DurationMS: elapsed.Milliseconds(), Status: http.StatusTooManyRequests, Outcome: provider.Retry.String()})
		return s.terminal(ctx, j, opKey, job.StatusDeadLettered, "rate_limited", &job.Error{Code: job.CodeRetriesExceeded,
			Message: fmt.Sprintf("the provider refused this job for rate %d times (admission.max_rate_limited)", j.RateLimited)})
	}
	s.m.RateLimitRequeues.WithLabelValues(j.Provider, j.Model, "requeued").Inc()
	j.Reservation = nil
	j.NotBefore = nil
	if info.RetryAfter > 0 && (j.Pinned || !s.grouped(j)) {
		// (A job other deployments may take is placed again at once:
		// this one waits out the Retry-After, paused and cooled.)
		nb := s.now().Add(info.RetryAfter).UTC()
		j.NotBefore = &nb
	}
	s.requeueOp(ctx, opKey, j, "throttled")
	return s.mesh.Requeue(ctx, j, mesh.RateLimited, strconv.Itoa(j.RateLimited))
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

// terminal ends a job that a provider call failed: the dead-letter entry
// (reason, last error, attempt history) first, then the result.
func (s *Service) terminal(ctx context.Context, j *task.Task, opKey string, status job.Status, reason string, e *job.Error) error {
	if err := dlq.Publish(ctx, s.mesh.JS, &dlq.Entry{Job: *j, Reason: reason, LastError: e, DeadAt: s.now().UTC()}); err != nil {
		return fmt.Errorf("dead-letter %s: %w", j.ID, err)
	}
	s.m.DeadLetters.WithLabelValues(reason).Inc()
	return s.finish(ctx, j, opKey, &mesh.Outcome{Status: status, Error: e})
}

// fallback asks the job's route for another target.
func (s *Service) fallback(j *task.Task, sit route.Situation) (route.Decision, bool) {
	rt, ok := s.router().RouteFor(j.Task, j.Model)
	if !ok {
		if len(j.Attempts) == 0 {
			return route.Decision{}, false
		}
		// A job already moved to a fallback keeps its original route.
		first := j.Attempts[0]
		if rt, ok = s.router().RouteFor(j.Task, first.Model); !ok {
			return route.Decision{}, false
		}
	}
	sit.BreakerOpen = func(t config.Target) bool {
		return s.breakers.Get(t.String()).State() == breaker.Open
	}
	sit.CredentialBroken = s.isBroken
	seen := map[config.Target]bool{}
	for _, a := range j.Attempts {
		t := config.Target{Provider: a.Provider, Model: a.Model}
		if !seen[t] {
			seen[t] = true
			sit.Tried = append(sit.Tried, t)
		}
	}
	if !seen[sit.Current] {
		sit.Tried = append(sit.Tried, sit.Current)
	}
	return s.router().Next(rt, sit)
}

// reroute sends the job to a fallback target: the request names the new
// model, the estimate is redone for it, and admission reserves its budget.
func (s *Service) reroute(ctx context.Context, msg jetstream.Msg, j *task.Task, opKey string, d route.Decision) error {
	body, err := withModel(j.Request, d.Target.Model)
	if err != nil {
		return s.terminal(ctx, j, opKey, job.StatusFailed, "invalid", &job.Error{Code: job.CodeInvalidRequest, Message: "cannot rewrite the request for the fallback model"})
	}
	_, est, err := tokens.Estimate(j.Endpoint, body, job.Limits{}, s.app().Limits.DefaultMaxTokens)
	if err != nil {
		return s.terminal(ctx, j, opKey, job.StatusFailed, "invalid", &job.Error{Code: job.CodeInvalidRequest, Message: err.Error()})
	}
	s.m.Fallbacks.WithLabelValues(j.Provider, d.Target.Provider, d.Reason).Inc()
	s.log.Info("fallback", "job_id", j.ID, "from", j.Provider+"/"+j.Model, "to", d.Target.String(), "reason", d.Reason)
	if _, m, ok := s.app().Deployment(d.Target.Provider, d.Target.Model); ok {
		// The units the new model limits, from the job's cost; units only
		// the first model limited cost nothing there. One its minute
		// cannot hold is refused by admission.
		est.Units, _ = guard.UnitCost(j.Cost, m, false)
	}
	j.Request, j.Provider, j.Model, j.Estimate = body, d.Target.Provider, d.Target.Model, &est
	j.Reservation, j.NotBefore = nil, nil
	s.guard.Seal(j)
	s.requeueOp(ctx, opKey, j, "reroute")
	return s.requeue(ctx, msg, j, opKey, backFallback)
}

// reservedUnits returns a reservation's units by the model's budget index
// (its unit names, sorted).
func reservedUnits(r *task.Reservation, m *config.Model) (u [budget.MaxUnits]int) {
	for i, name := range m.UnitNames() {
		u[i] = r.Units[name]
	}
	return u
}

// withModel returns body with its "model" replaced.
func withModel(body []byte, model string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	name, _ := json.Marshal(model)
	m["model"] = name
	return json.Marshal(m)
}

// markBroken records that a provider answered 401/403: its credential is
// treated as broken (primary_unavailable) for CredentialQuarantine.
func (s *Service) markBroken(t config.Target) {
	s.brokenMu.Lock()
	defer s.brokenMu.Unlock()
	s.broken[t.Provider] = s.now().Add(CredentialQuarantine)
}

func (s *Service) isBroken(t config.Target) bool {
	s.brokenMu.Lock()
	defer s.brokenMu.Unlock()
	return s.now().Before(s.broken[t.Provider])
}

// CredentialQuarantine is how long a provider whose credential was refused
// is treated as unavailable before it is tried again.
const CredentialQuarantine = time.Minute

// pause holds a model's dispatch fleet-wide until until: admission stops
// reserving for it and the model's DISPATCH consumer is paused.
func (s *Service) pause(ctx context.Context, j *task.Task, until time.Time) {
	if err := s.mesh.Pause(j.Provider, j.Model, until); err != nil {
		s.log.Debug("pause signal", "err", err)
	}
	name := keys.DispatchConsumer(j.Provider, job.ModelToken(j.Model))
	if _, err := s.mesh.JS.PauseConsumer(ctx, streams.Dispatch, name, until); err != nil {
		s.log.Debug("pause consumer", "consumer", name, "err", err)
	}
	s.m.Pauses.WithLabelValues(j.Provider, j.Model).Inc()
}

// seed corrects the shared window from the provider's own count: when its
// x-ratelimit-remaining-* shows less room than the window believes (someone
// else spends on the same key), the difference is charged. It never adds
// room, and runs at most once a second per model.
func (s *Service) seed(ctx context.Context, j *task.Task, rl provider.RateLimit) {
	if rl.RemainingTokens < 0 && rl.RemainingRequests < 0 {
		return
	}
	_, model, ok := s.app().Deployment(j.Provider, j.Model)
	if !ok {
		return
	}
	key := budget.ModelKey(j.Provider, job.ModelToken(j.Model))
	s.seedMu.Lock()
	if s.now().Sub(s.seeded[key]) < time.Second {
		s.seedMu.Unlock()
		return
	}
	s.seeded[key] = s.now()
	s.seedMu.Unlock()
	ac := adapt.For(s.app().Admission, *model)
	if rl.LimitRequests > 0 || rl.LimitTokens > 0 || rl.LimitOutput > 0 {
		if err := s.learn.Observe(ctx, adapt.Key(j.Provider, job.ModelToken(j.Model)), ac, [adapt.Dims]int{rl.LimitRequests, rl.LimitTokens, rl.LimitOutput}); err != nil {
			s.log.Debug("stated limits", "err", err)
		}
	}
	used, err := s.store.Used(ctx, key)
	if err != nil {
		return
	}
	// What the provider counted in its minute: its limit (as it states it,
	// else the configured one) less what it says remains.
	counted := func(stated, configured, remaining int) int {
		if remaining < 0 {
			return -1
		}
		if stated > 0 {
			return stated - remaining
		}
		if configured > 0 {
			return configured - remaining
		}
		return -1
	}
	var extra budget.Cost
	if n := counted(rl.LimitRequests, model.RPM, rl.RemainingRequests); n > used.Requests {
		extra.Requests = n - used.Requests
		s.m.Corrections.WithLabelValues(j.Provider, j.Model, "rpm").Inc()
	}
	if n := counted(rl.LimitTokens, model.TokenLimit(), rl.RemainingTokens); n > used.Tokens {
		extra.Tokens = n - used.Tokens
		s.m.Corrections.WithLabelValues(j.Provider, j.Model, "tpm").Inc()
	}
	if n := counted(rl.LimitOutput, model.OTPM, rl.RemainingOutput); model.SplitsOutput() && n > used.Output {
		extra.Output = n - used.Output
		s.m.Corrections.WithLabelValues(j.Provider, j.Model, "otpm").Inc()
	}
	if extra.Positive() {
		if err := s.store.Charge(ctx, key, extra); err != nil {
			s.log.Warn("seed: budget store", "err", err)
		}
	}
}

// settle records usage and charges the budget for prompt tokens the
// estimate missed.
func (s *Service) settle(ctx context.Context, j *task.Task, u job.Usage) {
	s.m.TokensUsed.WithLabelValues(j.Provider, j.Model).Add(float64(u.PromptTokens + u.CompletionTokens))
	s.m.TenantTokens.WithLabelValues(j.Tenant, "input").Add(float64(u.PromptTokens))
	s.m.TenantTokens.WithLabelValues(j.Tenant, "output").Add(float64(u.CompletionTokens))
	s.m.TenantTokens.WithLabelValues(j.Tenant, "cached").Add(float64(u.CachedTokens))
	s.m.TenantTokens.WithLabelValues(j.Tenant, "reasoning").Add(float64(u.ReasoningTokens))
	if j.Estimate == nil || j.Reservation == nil {
		return
	}
	if s.cfg.Calib != nil {
		r := s.cfg.Calib.Observe(ctx, j.Provider, job.ModelToken(j.Model), estimateClass(j), j.Estimate.PromptTokens, u.PromptTokens)
		s.m.EstimateRatio.WithLabelValues(j.Provider, j.Model).Set(r)
	}
	if s.settleSplit(ctx, j, u) { // anthropic.go
		return
	}
	extra := u.PromptTokens - reservedPrompt(j)
	if extra < 0 {
		s.returnOverReserved(ctx, j, -extra)
		return
	}
	if extra == 0 {
		return
	}
	var slice int64
	if _, err := fmt.Sscanf(j.Reservation.ID, "%d-", &slice); err != nil {
		return
	}
	s.charge(ctx, j.ID, budget.ModelKey(j.Provider, job.ModelToken(j.Model)), slice, budget.Cost{Tokens: extra})
}

func (s *Service) finish(ctx context.Context, j *task.Task, opKey string, r *mesh.Outcome) error {
	return s.finishHinted(ctx, j, opKey, r, nil, 0)
}

// markInFlight marks the operation in flight for this attempt. With
// ingest's revision of the record (task.Revs), it writes the in-flight
// record by compare-and-set at that revision without reading it: a record
// still at the revision ingest created it at is queued, unjoined and not
// cancelled, and its key, job and tenant are the job's. Otherwise (no
// hint, or the record changed since) it reads and updates the record. It
// returns the record as written (or as found, when it is done or
// cancelled: then *cancelled says which) and its revision; *wasInFlight
// says an earlier attempt had marked it in flight and not settled it.
// The record written carries sent, the mark that this call leaves; a
// record that carries an earlier call's mark is left as it is and *lost
// is set to it, unless the call may be made again (unknown.go).
func (s *Service) markInFlight(ctx context.Context, j *task.Task, opKey string, attempt int, sent *mesh.SentMark, lost **mesh.SentMark, cancelled, wasInFlight *bool) (*mesh.OpRecord, uint64, error) {
	if j.Revs != nil && j.Revs.Op > 0 {
		_, key := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
		r := &mesh.OpRecord{Key: key, JobID: j.ID, Tenant: j.Tenant, State: mesh.OpInFlight, Provider: j.Provider, Model: j.Model, Attempt: attempt, Sent: sent,
			BodyDigest: mesh.BodyDigest(j), Trace: tracing.Traceparent(ctx)} // the job's trace, as ingest wrote it
		if rev, err := s.mesh.PutOpAt(ctx, opKey, r, j.Revs.Op); err == nil {
			return r, rev, nil
		}
		// Changed since, gone, or not known to be written: read it.
	}
	return s.mesh.UpdateOpRev(ctx, opKey, func(r *mesh.OpRecord) bool {
		if r.State == mesh.OpCompleted || r.State == mesh.OpFailed {
			return false
		}
		if r.Cancelled {
			*cancelled = true
			return false
		}
		if r.Sent != nil && r.Sent.By != sent.By && !s.mayCallAgain(j) {
			*lost = r.Sent // an earlier call left; see lostCall
			return false
		}
		*wasInFlight = r.State == mesh.OpInFlight
		r.State, r.Provider, r.Model, r.Attempt, r.Sent = mesh.OpInFlight, j.Provider, j.Model, attempt, sent
		return true
	})
}

// finishHinted is finish; inFlight (at opRev) is the operation record as
// this attempt wrote it, passed on to the result service so it can settle
// the record without reading it (nil: not known).
func (s *Service) finishHinted(ctx context.Context, j *task.Task, opKey string, r *mesh.Outcome, inFlight *mesh.OpRecord, opRev uint64) error {
	if _, ended := s.ended.LoadAndDelete(j.Key()); !ended && r.Status != job.StatusSucceeded {
		if stream, _ := streamed(j); stream {
			// A streamed job that ends before its first token: its stream
			// subject says so too, for NATS readers.
			newChunkPublisher(s.mesh.JS, j, 0, s.now, nil).end(r.Status, r.Error)
		}
	}
	if len(r.Response) > s.app().Limits.MaxResponseBytes {
		r.Status, r.Response, r.Error = job.StatusFailed, nil, s.tooLarge()
	}
	hints := mesh.ResultHints{Op: inFlight, OpRev: opRev, Facts: mesh.FactsOf(j)}
	if ttft, ok := s.firstToken.LoadAndDelete(j.Key()); ok {
		hints.Facts.TTFTMS = ttft.(time.Duration).Milliseconds()
	}
	if j.Revs != nil {
		hints.RecordRev = j.Revs.Record
	}
	// Whatever the sizes agreed at start, an answer that cannot be stored
	// must not be redelivered: each delivery would pay again (TooLarge).
	_, err := s.mesh.Finish(ctx, j, *r, mesh.Exit{OpKey: opKey, Hints: hints, Price: s.app(), Wait: resultPublishWait, TooLarge: s.tooLarge(),
		Before: func(res *job.Result) { s.storeAnswer(ctx, j, res) }}) // cache.go
	return err
}

func (s *Service) tooLarge() *job.Error {
	return &job.Error{Code: job.CodeResponseTooLarge, Message: fmt.Sprintf(
		"the provider's answer is larger than limits.max_response_bytes (%d bytes): it was paid for once and is not stored, and the call is not repeated; raise the limit or ask for less output",
		s.app().Limits.MaxResponseBytes)}
}

// keepAlive tells JetStream the job is still being worked on while a call
// runs, so a long call is not redelivered to another executor.
func keepAlive(ctx context.Context, msg jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	var once sync.Once
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() { once.Do(func() { close(done) }) }
}

// dispatchSeq is the DISPATCH stream sequence of msg: the same on a
// redelivery, so what the executor publishes for it is deduplicated.
func dispatchSeq(msg jetstream.Msg) string {
	md, err := msg.Metadata()
	if err != nil {
		return job.NewID()
	}
	return fmt.Sprint(md.Sequence.Stream)
}

// holderName identifies this process in concurrency leases.
func holderName() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", h, os.Getpid(), job.NewID()[24:])
}
