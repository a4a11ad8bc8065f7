// Package ingest is Sluice's front door. It takes jobs from the INTAKE stream
// (producers publish to sluice.intake.<tenant>) and over HTTP (the jobs API
// and the OpenAI- and Anthropic-compatible endpoints), validates them, estimates
// their token cost, records their idempotency key and enqueues them on QUEUE.
// Bad input gets a clear error result and is never retried; a second
// submission of the same operation joins the first.
//
// Service wires small owned types, each the owner of one decision:
//   - acceptor: whether and how a job enters QUEUE (accept.go), for every
//     path;
//   - queueView: how full QUEUE and INTAKE are, and the waits that implies;
//   - responseCache: the response cache, one decorator around accept for
//     HTTP, the jobs API and INTAKE alike (cache.go);
//   - intake: the fate of each INTAKE message, and producers' wait hints;
//   - pipeline: submit-and-wait, one path from a decoded job to its answer
//     (pipeline.go, stream.go);
//   - the surfaces, one per HTTP API (surface.go): chatSurface (chat
//     completions, embeddings), messagesSurface, responsesSurface and
//     jobsSurface decode their API's request into a job and render its
//     result, errors and stream events; modelsAPI lists the models.
package ingest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/streams"
)

// Config is what ingest needs.
type Config struct {
	App *config.Config
	// Live, when set, is the configuration in effect, which a reload
	// replaces (App is then its first value); nil: App, fixed.
	Live       *config.Live
	TenantKeys map[string]string // bearer key -> tenant
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Guard seals estimates; nil: New makes one with the fleet key from
	// the fleet bucket.
	Guard *guard.Guard
	// Waiters bounds the HTTP requests per tenant that wait for a result
	// (shared with the result service); nil makes one from the config.
	Waiters *api.Waiters
	// Cache is the response cache (cache.go); nil: none.
	Cache *cache.Cache
	// Hints is the connection wait-hint requests are served on, one of
	// its own: tenants publish them, so a flood of them must not clog
	// the connection the services' JetStream traffic rides. nil: the
	// mesh's.
	Hints *nats.Conn
}

// deps is what every part of ingest reads: the configuration in effect,
// the mesh, the log, the metrics and the clock. The owned types share one.
type deps struct {
	live *config.Live
	cfg  Config
	lim  job.Limits
	mesh *mesh.Mesh
	log  *slog.Logger
	m    *metrics.Set
	now  func() time.Time
}

// Service is the ingest service. It wires the owned types: the acceptor
// (whether and how a job enters QUEUE), the queue view (how full QUEUE
// and INTAKE are), the response cache (the one decorator around accept),
// intake (the fate of each INTAKE message), the submit-and-wait pipeline
// and the surfaces, one per HTTP API.
type Service struct {
	*deps

	queue    *queueView
	acceptor *acceptor
	cache    *responseCache
	intake   *intake
	pipe     *pipeline
}

// New builds the service; it does no I/O.
func New(cfg Config, m *mesh.Mesh, log *slog.Logger, ms *metrics.Set) (*Service, error) {
	if cfg.Live != nil {
		cfg.App = cfg.Live.Load()
	} else if cfg.App != nil {
		cfg.Live = config.NewLive(cfg.App)
	}
	if cfg.App == nil {
		return nil, errors.New("ingest: no configuration")
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	if cfg.Guard == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		key, err := guard.LoadKey(ctx, m.Fleet)
		if err != nil {
			return nil, err
		}
		cfg.Guard = guard.NewLive(cfg.Live, key)
	}
	// Each model's tokenizer loads with the node (before it serves), not
	// on the way of its first job.
	var models []string
	for _, p := range cfg.App.Providers {
		for _, m := range p.Models {
			models = append(models, m.Name)
		}
	}
	tokens.Warm(models...)
	if cfg.Waiters == nil {
		n := cfg.App.Limits.MaxWaitersPerTenant
		if n < 1 {
			n = config.DefaultMaxWaitersPerTenant
		}
		cfg.Waiters = api.NewWaiters(n)
	}
	d := &deps{
		live: cfg.Live,
		cfg:  cfg,
		lim:  job.Limits{MaxBodyBytes: cfg.App.Limits.MaxBodyBytes, MaxTokens: cfg.App.Limits.MaxTokens},
		mesh: m,
		log:  log.With("service", "ingest"),
		m:    ms,
		now:  now,
	}
	return assemble(d), nil
}

// assemble builds the owned types over d.
func assemble(d *deps) *Service {
	qs, is := newShares(d.cfg.App)
	s := &Service{deps: d, queue: &queueView{deps: d}, cache: &responseCache{deps: d}}
	s.acceptor = &acceptor{deps: d, queue: s.queue, queueShare: qs}
	s.intake = &intake{deps: d, queue: s.queue, acceptor: s.acceptor, cache: s.cache, intakeShare: is}
	s.pipe = &pipeline{deps: d, acceptor: s.acceptor, cache: s.cache, limits: newLimitView(d.cfg.Live, d.mesh, d.now)}
	return s
}

// acceptor owns whether and how a job enters QUEUE: its checks, its
// route and estimate, its records (or the operation it joins) and the
// enqueue, undone when QUEUE refuses it (accept.go).
type acceptor struct {
	*deps
	queue      *queueView
	queueShare *share // each tenant's bytes in QUEUE
}

// queueView owns ingest's reading of how full QUEUE and INTAKE are, and
// the waits it estimates from that.
type queueView struct {
	*deps
	qmu     sync.Mutex
	qAt     time.Time
	qMsgs   uint64 // QUEUE's messages
	qLimit  uint64 // QUEUE's max_msgs
	iMsgs   uint64 // INTAKE's messages
	avgCost float64
}

// intake owns the fate of each INTAKE message: accepted (ack), kept
// waiting (nak with a delay), or refused with a result; and the wait
// hints producers INTAKE refused ask for.
type intake struct {
	*deps
	queue       *queueView
	acceptor    *acceptor
	cache       *responseCache
	intakeShare *share // each tenant's bytes in INTAKE
}

// app is the configuration in effect (cfg.App for a Service built
// without New, in tests).
func (s *deps) app() *config.Config { return s.live.Or(s.cfg.App) }

// keyAllows refuses a model the caller's API key may not call (its
// api_keys entry lists others), as OpenAI answers a model the key cannot
// see: model_not_found, without saying whether it exists.
func keyAllows(ctx context.Context, model string) error {
	if api.ModelAllowed(ctx, model) {
		return nil
	}
	return &job.ValidationError{Code: job.CodeUnknownModel, Field: "model", Message: fmt.Sprintf("model %q is not available to this API key", clip.String(model, 64))}
}

// Cancel asks for a job to stop (the pipeline's Cancel).
func (s *Service) Cancel(ctx context.Context, tenant, jobID, idemKey string) {
	s.pipe.Cancel(ctx, tenant, jobID, idemKey)
}

// Accepted is the outcome of a successful submission.
type Accepted struct {
	JobID  string
	Tenant string
	// Joined is set when the submission joined an earlier job with the same
	// idempotency key; JobID is then the earlier job's id.
	Joined bool
}

// transientError marks a failure worth retrying (the store is unreachable,
// a stream is full); anything else from accept is the job's own fault.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// ErrQueueFull is returned when QUEUE refuses new jobs.
var ErrQueueFull = errors.New("queue full")

// BusyError refuses a job for now: the queue is full, or this priority is
// being shed under pressure. RetryAfter is estimated from the queue ahead
// and the model's admission rate.
type BusyError struct {
	Code string // queue_full or shed
	// RetryAfter is the honest wait: the jobs ahead at the model's limits.
	// Over HTTP it is capped at MaxRetryAfter in the Retry-After header.
	RetryAfter time.Duration
	// Ahead is how many jobs wait in QUEUE (all models), as last read.
	Ahead   uint64
	Message string
	// Bound names the tenant's own bound that refused the job (a
	// queues.*.max_bytes_per_tenant key); "" when QUEUE as a whole is full.
	Bound string
}

func (e *BusyError) Error() string { return e.Code + ": " + e.Message }

// Is makes every BusyError match ErrQueueFull.
func (e *BusyError) Is(target error) bool { return target == ErrQueueFull }

// Accept validates a decoded job and enqueues it. A *job.ValidationError
// means the job is refused; ErrQueueFull means try later. A job refused
// because QUEUE is full leaves nothing behind: the job and operation
// records this call created are withdrawn, so the job is unknown, as the
// refusal says.
func (s *Service) Accept(ctx context.Context, j *task.Task) (Accepted, error) {
	return s.acceptor.accept(ctx, j, false)
}

// created holds the revisions of the records one accept call created (0:
// it created none).
type created struct{ job, op uint64 }

// accept is Accept; held says the caller holds the job durably and offers
// it again later (an INTAKE message), so a job QUEUE refuses keeps its
// records: it is accepted and waits. Its phases are in accept.go.
func (s *acceptor) accept(ctx context.Context, j *task.Task, held bool) (acc Accepted, err error) {
	ctx, span := s.mesh.Tracing.Start(ctx, tracing.SpanAccept)
	defer func() { endAccept(span, j, held, acc, err) }()
	prov, model, est, err := s.check(j)
	if err != nil {
		return Accepted{}, err
	}
	if err := keyAllows(ctx, model.Name); err != nil {
		return Accepted{}, err
	}
	now := s.now().UTC()
	room, err := s.admit(ctx, j, s.capacity(j, model), est.Cost(), now)
	if err != nil {
		return Accepted{}, err
	}
	s.stamp(j, prov, model, est, now)
	opKey, made, joined, err := s.record(ctx, j, held, now)
	if err != nil {
		return Accepted{}, err
	}
	if joined != nil {
		return *joined, nil
	}
	return s.enqueue(ctx, j, held, opKey, made, room)
}

// settleRefusal undoes what one accept call created for a job QUEUE
// refused, and returns the refusal. Each record is withdrawn only at the
// revision this call wrote, so nothing another writer changed is lost.
// When the operation record has changed, another submission joined this
// job and waits for its result: the job is then taken after all, handed
// to INTAKE, which ingest offers to QUEUE until it fits, and accept
// reports it accepted.
func (s *acceptor) settleRefusal(ctx context.Context, j *task.Task, opKey string, made created, busy error) (Accepted, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := withdraw(ctx, s.mesh.Idempotency, opKey, made.op)
	if err == nil {
		// The job record follows the operation record: a job without one
		// is unknown to everyone.
		err = withdraw(ctx, s.mesh.Results, keys.Record(j.Tenant, j.ID), made.job)
	}
	if err == nil {
		return Accepted{}, busy
	}
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		s.log.Warn("refused job: could not withdraw its records; taking it through intake", "job_id", j.ID, "tenant", j.Tenant, "err", err)
	}
	msg := nats.NewMsg(job.IntakeSubject(j.Tenant))
	msg.Data, _ = json.Marshal(j)
	secret := make([]byte, 16) // published once: an id no tenant can compute
	_, _ = rand.Read(secret)
	msg.Header.Set(jetstream.MsgIDHeader, job.IntakeMsgID(secret, j.Tenant, j.ID, msg.Data))
	if _, perr := s.mesh.JS.PublishMsg(ctx, msg); perr != nil {
		s.log.Warn("refused job: intake refused it too; its records stay", "job_id", j.ID, "tenant", j.Tenant, "err", perr)
		return Accepted{}, busy
	}
	return Accepted{JobID: j.ID, Tenant: j.Tenant}, nil
}

// withdraw deletes a record that is still at revision rev (0: none). It
// purges the key with a marker that expires after WithdrawnTTL: a plain
// delete marker would stay for the bucket's TTL, one per refused job, so
// the store (and the server's memory, which indexes every key) would grow
// with the offered load.
func withdraw(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64) error {
	if rev == 0 {
		return nil
	}
	return kv.Purge(ctx, key, jetstream.LastRevision(rev), jetstream.PurgeTTL(WithdrawnTTL))
}

// WithdrawnTTL is how long the marker of a withdrawn record stays; the
// results and idempotency buckets must allow marker TTLs
// (limit_marker_ttl).
const WithdrawnTTL = time.Minute

// CodeDeadlineUnmeetable refuses a job whose deadline the queue ahead makes
// impossible.
const CodeDeadlineUnmeetable = "deadline_unmeetable"

// pressure returns how full QUEUE is (0..1), the estimated wait before a
// job of cost tokens on model would be admitted, and the wait to suggest
// to a producer QUEUE refuses (at least a second). Both waits are the jobs
// queued ahead, at the average cost seen, at the model's limits; the first
// is optimistic (an idle window admits up to a minute's worth at once, so
// a deadline is refused only when it surely cannot be met), the second
// assumes the window busy, as it is when QUEUE is full. QUEUE holds every
// model's jobs, so with several models the estimates err long.
func (s *queueView) pressure(ctx context.Context, model *config.Model, cost int) (fill float64, wait, retry time.Duration, ahead uint64) {
	b := s.backlog(ctx, cost)
	if b.queueLimit > 0 {
		fill = float64(b.queue) / float64(b.queueLimit)
	}
	return fill, waitFor(model, b.queue, b.avgCost, cost, false), max(waitFor(model, b.queue, b.avgCost, cost, true), time.Second), b.queue
}

// backlog is the state of the two queues as ingest last read it.
type backlog struct {
	queue, queueLimit, intake uint64
	avgCost                   float64 // tokens per job, smoothed
}

// backlog reads QUEUE's and INTAKE's state, at most once a second, and
// folds cost (0: none) into the average job cost.
func (s *queueView) backlog(ctx context.Context, cost int) backlog {
	s.qmu.Lock()
	if s.now().Sub(s.qAt) > time.Second {
		s.qAt = s.now()
		s.qmu.Unlock()
		var msgs, limit, intake uint64
		if st, err := s.mesh.JS.Stream(ctx, streams.Queue); err == nil {
			if info, err := st.Info(ctx); err == nil {
				msgs = info.State.Msgs
				if info.Config.MaxMsgs > 0 {
					limit = uint64(info.Config.MaxMsgs)
				}
			}
		}
		if st, err := s.mesh.JS.Stream(ctx, streams.Intake); err == nil {
			if info, err := st.Info(ctx); err == nil {
				intake = info.State.Msgs
			}
		}
		s.qmu.Lock()
		s.qMsgs, s.qLimit, s.iMsgs = msgs, limit, intake
	}
	if cost > 0 {
		s.avgCost = 0.99*s.avgCost + 0.01*float64(cost)
		if s.avgCost < 1 {
			s.avgCost = float64(cost)
		}
	}
	b := backlog{queue: s.qMsgs, queueLimit: s.qLimit, intake: s.iMsgs, avgCost: s.avgCost}
	s.qmu.Unlock()
	return b
}

// waitFor estimates how long a job of cost tokens on model waits behind
// ahead jobs of avg tokens each, at the model's limits. Unless busy, what
// fits in a minute's window is taken to be admitted at once.
func waitFor(model *config.Model, ahead uint64, avg float64, cost int, busy bool) time.Duration {
	var wait time.Duration
	if model.TPM > 0 {
		wait = max(wait, time.Duration((float64(ahead)*avg+float64(cost))/(float64(model.TPM)/60)*float64(time.Second)))
	}
	if model.RPM > 0 {
		wait = max(wait, time.Duration(float64(ahead+1)/(float64(model.RPM)/60)*float64(time.Second)))
	}
	if !busy && model.TPM > 0 && float64(ahead)*avg+float64(cost) <= float64(model.TPM) && (model.RPM == 0 || int(ahead)+1 <= model.RPM) {
		wait = 0
	}
	return wait
}

// intakeWait is the wait ingest suggests to a producer whose job INTAKE
// refused (data is that job's envelope): as for a job QUEUE refuses, with
// the jobs waiting in INTAKE counted ahead too. For a job whose model is
// unknown it is the longest wait over the configured models.
func (s *intake) intakeWait(ctx context.Context, data []byte) time.Duration {
	var j task.Task
	var model *config.Model
	cost := 0
	if len(data) > MaxHintBytes {
		cost = len(data) / 4
	} else if json.Unmarshal(data, &j) == nil {
		if name, est, err := tokens.Estimate(j.Endpoint, j.Request, s.lim, s.app().Limits.DefaultMaxTokens); err == nil {
			if _, m, ok := s.app().ModelRef(name); ok {
				model, cost = m, est.Cost()
			}
		}
	}
	b := s.queue.backlog(ctx, 0)
	ahead := b.queue + b.intake
	if cost == 0 {
		cost = int(b.avgCost)
	}
	wait := time.Duration(0)
	if model != nil {
		wait = waitFor(model, ahead, b.avgCost, cost, true)
	} else {
		for _, p := range s.app().Providers {
			for i := range p.Models {
				wait = max(wait, waitFor(&p.Models[i], ahead, b.avgCost, cost, true))
			}
		}
	}
	return max(wait, time.Second)
}

// join attaches j to the operation already recorded under opKey. It returns
// the job id j joined, or "" when the record is j's own (a repeat of the
// same job, which then continues to enqueue).
func (s *acceptor) join(ctx context.Context, opKey string, j *task.Task) (string, error) {
	var done, mismatch bool
	digest := mesh.BodyDigest(j)
	rec, err := s.mesh.UpdateOp(ctx, opKey, func(r *mesh.OpRecord) bool {
		if r.JobID == j.ID {
			return false
		}
		if mismatch = digest != "" && r.BodyDigest != "" && r.BodyDigest != digest; mismatch {
			return false
		}
		switch r.State {
		case mesh.OpCompleted, mesh.OpFailed:
			done = true
			return false
		}
		for _, id := range r.Joiners {
			if id == j.ID {
				return false
			}
		}
		r.Joiners = append(r.Joiners, j.ID)
		return true
	})
	if err != nil {
		return "", &transientError{err}
	}
	if mismatch {
		return "", errIdempotencyMismatch
	}
	if rec.JobID == j.ID {
		return "", nil
	}
	tracing.LinkTo(ctx, rec.Trace) // the operation's work is in its first job's trace
	if done {
		// The operation already ended: answer this job from the stored result.
		orig, _, err := s.mesh.Lookup(ctx, j.Tenant, rec.JobID)
		if err != nil {
			return "", &transientError{err}
		}
		if orig.Result != nil {
			if _, err := s.mesh.Finish(ctx, j, mesh.Outcome{Shared: orig.Result}, mesh.Exit{}); err != nil {
				return "", &transientError{err}
			}
		}
	}
	return rec.JobID, nil
}

// IntakeParallel bounds the INTAKE messages one ingest process handles at
// once.
const IntakeParallel = 32

// Run consumes INTAKE until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	// Each accept waits on three round trips (two records, then QUEUE);
	// handled one at a time, they bound ingest to one job per three round
	// trips whatever the cores. Up to IntakeParallel run at once: jobs are
	// independent (accept is idempotent per job id), so only the order in
	// which concurrently delivered jobs reach QUEUE may differ from INTAKE's.
	loop, err := s.mesh.Consume(ctx, mesh.Consumer{Stream: streams.Intake, Template: "ingest", What: "intake", Batch: 512, Parallel: IntakeParallel,
		Restarted: s.m.ConsumeRestarted(streams.Intake)}, s.log,
		s.intake.handle)
	if err != nil {
		return err
	}
	// Producers INTAKE refuses ask how long to wait; one ingest process answers.
	var hints hintGate
	defer hints.close()
	hc := s.cfg.Hints
	if hc == nil {
		hc = s.mesh.JS.Conn()
	}
	sub, err := hc.QueueSubscribe(job.WaitPrefix+"*", "ingest", func(m *nats.Msg) {
		if !mesh.ReplyAllowed(m.Reply, client.InboxPrefix(m.Subject[len(job.WaitPrefix):])) {
			s.m.RepliesDropped.WithLabelValues("ingest").Inc()
			s.log.Debug("wait hint: reply subject refused", "len", len(m.Reply))
			return
		}
		hints.serve(ctx, m, func(ctx context.Context, m *nats.Msg) {
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			data, _ := json.Marshal(job.WaitHint{RetryAfterMS: s.intake.intakeWait(wctx, m.Data).Milliseconds()})
			_ = m.Respond(data)
		})
	})
	if err != nil {
		loop.Stop()
		return fmt.Errorf("subscribe %s*: %w", job.WaitPrefix, err)
	}
	// What waits beyond these is dropped (the producer's wait then falls
	// back to its default): a hint is a few bytes, a flood is not.
	_ = sub.SetPendingLimits(hintsPending, hintsPendingBytes)
	<-ctx.Done()
	_ = sub.Drain()
	loop.Drain(10 * time.Second)
	return nil
}

func (s *intake) handle(ctx context.Context, msg jetstream.Msg) error {
	tenant, _ := job.TenantFromIntake(msg.Subject())
	env, derr := job.Parse(msg.Data(), s.lim) // accept checks it
	if env == nil {
		env = &job.Job{}
	}
	j := task.New(*env)
	if j.Tenant == "" {
		j.Tenant = tenant
	}
	var err error
	switch {
	case derr != nil:
		err = derr
	case j.Tenant != tenant:
		err = &job.ValidationError{Code: job.CodeInvalidRequest, Field: "tenant", Message: fmt.Sprintf("%q does not match the subject's tenant %q", clip.String(j.Tenant, 64), tenant)}
	default:
		ctx := s.mesh.Tracing.FromMsg(ctx, msg)
		_, _, _, err = s.cache.accept(ctx, j, jobCall(ctx, s.cache, j), func() (Accepted, error) { return s.acceptor.accept(ctx, j, true) }) // cache.go
	}
	var te *transientError
	switch {
	case err == nil:
		s.m.JobsAccepted.WithLabelValues(j.Tenant, "nats").Inc()
		return nil
	case errors.Is(err, ErrQueueFull):
		// INTAKE keeps the job (deferred); as it fills, producers get the
		// stream's refusal. It is offered again after half the estimated
		// drain time, so QUEUE does not run dry while jobs wait here.
		if md, err := msg.Metadata(); err == nil {
			s.intakeShare.arrived(tenant, md.Sequence.Stream, storedSize(msg))
		}
		if over := s.intakeOver(ctx, tenant, err); over != nil {
			d := s.refuse(ctx, msg, j, tenant, over)
			s.intakeShare.gone(tenant)
			return d
		}
		d := time.Second
		var be *BusyError
		if errors.As(err, &be) {
			d = min(max(be.RetryAfter/2, time.Second), 30*time.Second)
		}
		return mesh.Retry(d)
	case errors.As(err, &te):
		s.log.Warn("intake: will retry", "err", err)
		return mesh.Retry(2 * time.Second)
	default:
		return s.refuse(ctx, msg, j, tenant, err)
	}
}

// refuse answers an invalid job with a failed result and drops it.
func (s *intake) refuse(ctx context.Context, msg jetstream.Msg, j *task.Task, tenant string, err error) error {
	var ve *job.ValidationError
	jerr := &job.Error{Code: job.CodeInvalidRequest, Message: err.Error()}
	if errors.As(err, &ve) {
		jerr = ve.AsError()
	}
	s.m.JobsRejected.WithLabelValues("nats", jerr.Code).Inc()
	if tenant == "" || !job.ValidName(tenant) {
		s.log.Warn("intake: dropped job on an invalid subject", "code", jerr.Code)
		return mesh.Poison(err)
	}
	id := j.ID
	if id == "" || !job.CanonicalID(id) {
		id = job.NewID()
	}
	if _, ok := s.app().Tenant(tenant); !ok {
		// Nothing is stored for a tenant Sluice does not know, but a
		// producer listening on the result subject still learns why.
		res := mesh.Outcome{Status: job.StatusFailed, Error: &job.Error{Code: job.CodeUnknownTenant, Message: fmt.Sprintf("unknown tenant %q", tenant)}}
		_, _ = s.mesh.Finish(ctx, refused(tenant, id, time.Time{}, s.now()), res, mesh.Exit{Announce: true, Now: s.now()})
		s.log.Warn("intake: refused job for unknown tenant", "job_id", id, "code", job.CodeUnknownTenant)
		return mesh.Poison(err)
	}
	res := mesh.Outcome{Status: job.StatusFailed, Error: jerr}
	stored, submitted, lerr := false, time.Time{}, error(nil)
	if id == j.ID {
		stored, submitted, lerr = s.refusalStored(ctx, tenant, id)
	}
	rj := refused(tenant, id, submitted, s.now())
	if lerr != nil {
		s.log.Warn("intake: could not look the refused job up, will retry", "err", lerr)
		return mesh.Retry(2 * time.Second)
	}
	if !stored {
		_, _ = s.mesh.Finish(ctx, rj, res, mesh.Exit{Announce: true, Now: s.now()})
		return nil
	}
	// The operation ends with the job (if it is this job's): a submission
	// that joined it gets the refusal rather than waiting for a job that
	// never runs.
	opKey, _ := mesh.OpKey(tenant, j.IdempotencyKey, id)
	if _, perr := s.mesh.Finish(ctx, rj, res, mesh.Exit{OpKey: opKey, Now: s.now()}); perr != nil {
		s.log.Warn("intake: could not publish refusal, will retry", "err", perr)
		return mesh.Retry(2 * time.Second)
	}
	s.log.Info("job refused", "job_id", id, "tenant", tenant, "code", jerr.Code)
	return nil
}
