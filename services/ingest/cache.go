package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// cacheRead bounds a cache lookup: past it the request is a miss.
const cacheRead = 2 * time.Second

// cacheBefore runs for a chat request (body as the chat body, j not yet
// accepted): a cache hit is answered here (done is true, as it is for a
// cache header Sluice refuses, or a hit its tenant's budget cannot take
// now); otherwise it returns the request's plan (nil: the cache has
// nothing to do with it), for cacheAccept.
func (s *Service) cacheBefore(w http.ResponseWriter, r *http.Request, j *task.Task, body []byte) (p *cache.Plan, done bool) {
	j.CacheTarget = nil
	c := s.cfg.Cache
	if c == nil {
		return nil, false
	}
	ask, err := cache.AskFromHeader(r.Header)
	if err == nil {
		p, err = cache.Decide(cache.Request{App: s.app(), Tenant: j.Tenant, Endpoint: j.Endpoint, Ask: ask, Body: body, IdempotencyKey: j.IdempotencyKey})
	}
	if err == nil && p != nil {
		err = keyAllows(r.Context(), p.Model)
	}
	if err != nil {
		s.fail(w, "openai", err)
		return nil, true
	}
	if p == nil {
		return nil, false
	}
	if e, age, ok := s.cacheGet(r.Context(), p); ok {
		s.serveHit(w, r, p, j.Tenant, e, age)
		return nil, true
	}
	if p.Asked {
		w.Header().Set(cache.Header, result(p))
	}
	return p, false
}

// cacheAccept runs accept for a chat request its plan p (nil: none) did
// not answer at cacheBefore's lookup, with j prepared (prepare). When the
// second lookup of prepare finds the answer, it is served from the cache
// (done) and accept does not run.
func (s *Service) cacheAccept(w http.ResponseWriter, r *http.Request, p *cache.Plan, j *task.Task, accept func() (Accepted, error)) (acc Accepted, done bool, err error) {
	if p == nil {
		acc, err = accept()
		return acc, false, err
	}
	release, e, age := s.prepare(r.Context(), p, j)
	defer release()
	if e != nil {
		s.serveHit(w, r, p, j.Tenant, e, age)
		return Accepted{}, true, nil
	}
	acc, err = accept()
	return acc, false, err
}

// serveHit answers a chat request from the cache when its tenant's budget
// allows (hitBudget), and counts it.
func (s *Service) serveHit(w http.ResponseWriter, r *http.Request, p *cache.Plan, tenant string, e *cache.Entry, age time.Duration) {
	if err := s.hitBudget(r.Context(), tenant); err != nil {
		s.fail(w, "openai", err)
		return
	}
	s.countHit(p, tenant, e)
	s.answerCached(w, p, e, age)
}

// acceptCached is accept for a job envelope (POST /v1/jobs, INTAKE) with
// the cache in front: a hit is answered with a result published for the
// job (serveJob); otherwise accept runs with j prepared (prepare). A cache
// option Sluice cannot honour is a *job.ValidationError.
func (s *Service) acceptCached(ctx context.Context, j *task.Task, accept func() (Accepted, error)) (Accepted, error) {
	j.CacheTarget = nil // never a producer's
	c := s.cfg.Cache
	if c == nil || (j.ID != "" && !job.CanonicalID(j.ID)) {
		return accept() // which refuses what is wrong
	}
	if _, ok := s.app().Tenant(j.Tenant); !ok {
		return accept()
	}
	p, err := cache.Decide(cache.Request{App: s.app(), Tenant: j.Tenant, Endpoint: j.Endpoint, Ask: j.Cache, Body: j.Request, IdempotencyKey: j.IdempotencyKey})
	if err == nil && p != nil {
		err = keyAllows(ctx, p.Model)
	}
	if err != nil {
		return Accepted{}, err
	}
	if p == nil {
		return accept()
	}
	if e, _, ok := s.cacheGet(ctx, p); ok {
		if acc, served, err := s.serveJob(ctx, p, j, e); served || err != nil {
			return acc, err
		}
	}
	release, e, _ := s.prepare(ctx, p, j)
	defer release()
	if e != nil {
		if acc, served, err := s.serveJob(ctx, p, j, e); served || err != nil {
			return acc, err
		}
	}
	return accept()
}

// serveJob answers a job envelope from the cache entry e, with a result
// published for it, when its tenant's budget allows (hitBudget). A job
// whose id has a record already is not served: accept knows what a
// repeat is.
func (s *Service) serveJob(ctx context.Context, p *cache.Plan, j *task.Task, e *cache.Entry) (acc Accepted, served bool, err error) {
	if err := s.hitBudget(ctx, j.Tenant); err != nil {
		return Accepted{}, false, err
	}
	if j.ID == "" {
		j.ID = job.NewID()
	}
	// The job's record first, as accept makes it: the job is known (GET
	// /v1/jobs/{id}) from the moment it is acknowledged.
	now := s.now().UTC()
	data, _ := json.Marshal(&mesh.Record{JobID: j.ID, Tenant: j.Tenant, Status: job.StatusQueued, SubmittedAt: now})
	rev, err := s.mesh.Results.Create(ctx, keys.Record(j.Tenant, j.ID), data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return Accepted{}, false, nil
	}
	if err != nil {
		return Accepted{}, false, &transientError{err}
	}
	s.countHit(p, j.Tenant, e)
	// The usage is the stored call's; this answer was not paid for.
	res := mesh.Outcome{Status: job.StatusSucceeded, Response: e.Response, Usage: e.Usage, Unpaid: true, Provider: e.Provider, Model: e.Model}
	hit := &task.Task{Job: j.Job, SubmittedAt: now}
	if _, err := s.mesh.Finish(ctx, hit, res, mesh.Exit{Hints: mesh.ResultHints{RecordRev: rev}, Now: now}); err != nil {
		return Accepted{}, false, &transientError{err}
	}
	j.CacheTarget, j.IdempotencyKey = nil, ""
	return Accepted{JobID: j.ID, Tenant: j.Tenant}, true, nil
}

// cacheGet reads a plan's entry when it may be read.
func (s *Service) cacheGet(ctx context.Context, p *cache.Plan) (*cache.Entry, time.Duration, bool) {
	if !p.Read {
		return nil, 0, false
	}
	ctx, cancel := context.WithTimeout(ctx, cacheRead)
	defer cancel()
	return s.cfg.Cache.Get(ctx, p.Key)
}

// countHit counts a request answered from the cache, and what it did not
// pay for.
func (s *Service) countHit(p *cache.Plan, tenant string, e *cache.Entry) {
	m := s.cfg.Cache.Metrics()
	m.Request(cache.Hit)
	m.Saved(s.app(), tenant, p.Model, e.Usage)
}

func result(p *cache.Plan) string {
	if p.Read {
		return cache.Miss
	}
	return cache.Bypass
}

// prepare readies a job the cache did not answer at its first lookup: the
// executor stores its answer at the plan's target, and, when identical
// requests in flight are to share one call, the job takes the plan's
// coalescing key, so that accept joins it to an identical job in flight
// anywhere in the fleet. Such a job holds this process's lock on the key
// until release (see keyLocks), and the cache is looked up again once
// freshOp has run: an identical call that ended since the first lookup
// stored its answer (if one to keep) before its result went out, so
// before its operation record ended or went, and a request that missed
// it by a moment must not make a second call for it. e is the entry that
// second lookup found; the request is counted a miss (or bypass) when
// there is none.
func (s *Service) prepare(ctx context.Context, p *cache.Plan, j *task.Task) (release func(), e *cache.Entry, age time.Duration) {
	j.CacheTarget = p.Target()
	release = func() {}
	if p.Coalesce != "" && j.IdempotencyKey == "" {
		j.IdempotencyKey = p.Coalesce
		release = s.coalescing(j)
		s.freshOp(ctx, j.Tenant, p.Coalesce)
		var ok bool
		if e, age, ok = s.cacheGet(ctx, p); ok {
			return release, e, age
		}
	}
	if p.Asked {
		s.cfg.Cache.Metrics().Request(result(p))
	}
	return release, nil, 0
}

// cacheAccepted notes a request that joined an identical call in flight.
func (s *Service) cacheAccepted(p *cache.Plan, acc Accepted) {
	if p != nil && p.Coalesce != "" && acc.Joined {
		s.cfg.Cache.Metrics().Coalesced()
	}
}

// cacheAnswered counts the tokens a request that joined an identical call
// did not pay for.
func (s *Service) cacheAnswered(p *cache.Plan, acc Accepted, res *job.Result) {
	if p != nil && p.Coalesce != "" && acc.Joined && res != nil && res.Status == job.StatusSucceeded {
		s.cfg.Cache.Metrics().Saved(s.app(), acc.Tenant, p.Model, res.Usage)
	}
}

// freshOp clears an ended operation record under a coalescing key: a new
// request must be answered by the cache or by a call of its own, never by
// joining an operation that ended (its answer may not have been one worth
// keeping, or may have expired from the cache). A job whose result is out
// but whose record the result service has not settled yet is waited for
// briefly: the record goes once settled (the result service answers the
// jobs that joined it from the record), only at the revision read.
func (s *Service) freshOp(ctx context.Context, tenant, key string) {
	opKey, _ := mesh.OpKey(tenant, key, "")
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cacheRead)
	defer cancel()
	for ended := false; ; {
		rec, rev, err := s.mesh.GetOp(ctx, opKey)
		if err != nil {
			return
		}
		if rec.State == mesh.OpCompleted || rec.State == mesh.OpFailed || (rec.Cancelled && len(rec.Joiners) == 0) {
			_ = withdraw(ctx, s.mesh.Idempotency, opKey, rev)
			return
		}
		if !ended {
			if _, err := s.mesh.StoredResult(ctx, tenant, rec.JobID); err != nil {
				return // in flight: join it
			}
			ended = true
		}
		select {
		case <-ctx.Done():
			return // not settled in time: the request joins the ended job
		case <-time.After(settlePoll):
		}
	}
}

// settlePoll is how often freshOp looks whether an ended job's operation
// record is settled.
const settlePoll = 20 * time.Millisecond

// answerCached answers from a cache entry as the caller asked: the
// chat.completion, or its chunks as a stream (Anthropic's events on
// /v1/messages, through the captured writer).
func (s *Service) answerCached(w http.ResponseWriter, p *cache.Plan, e *cache.Entry, age time.Duration) {
	h := w.Header()
	h.Set(cache.Header, cache.Hit)
	h.Set("Age", strconv.FormatInt(int64(age/time.Second), 10))
	if !p.Stream {
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(e.Response)
		return
	}
	out, f := w, eventFormat(openAIEvents{})
	if c, ok := w.(*captured); ok && c.stream != nil { // POST /v1/messages
		out, f = c.beginStream(), c.stream
	}
	oh := out.Header()
	oh.Set("Content-Type", "text/event-stream; charset=utf-8")
	oh.Set("Cache-Control", "no-cache")
	oh.Set("X-Accel-Buffering", "no")
	out.WriteHeader(http.StatusOK)
	api.ExtendDeadlines(out, deadlineSlack)
	for _, c := range job.CompletionChunks(e.Response, p.Usage) {
		if !f.chunk(out, c) {
			return
		}
	}
	f.done(out)
	_ = http.NewResponseController(out).Flush()
}

// keyLocks serialize, within one process, the accepts of identical
// requests that coalesce (from freshOp on, see prepare): each joins the
// operation record by compare-and-set, and fifty of them at once would
// mostly conflict and run out of attempts; one after another, each joins
// at its first.
type keyLocks struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int
}

// lock takes key's lock and returns its release.
func (k *keyLocks) lock(key string) (release func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// coalescing takes, for a job that coalesces under its idempotency key,
// the process's lock on that key (see keyLocks); it returns the release.
func (s *Service) coalescing(j *task.Task) (release func()) {
	if s.cfg.Cache == nil || !strings.HasPrefix(j.IdempotencyKey, mesh.CoalescePrefix) {
		return func() {}
	}
	return s.coalesce.lock(j.Tenant + "\x00" + j.IdempotencyKey)
}
