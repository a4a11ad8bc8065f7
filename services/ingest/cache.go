package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// cacheRead bounds a cache lookup: past it the request is a miss.
const cacheRead = 2 * time.Second

// responseCache owns the response cache's part in accepting a job: it is
// the one decorator around accept, for HTTP, the jobs API and INTAKE
// alike. It decides a request's plan, answers a hit the way its caller
// serves one (cacheCall), readies a miss (the answer's target, the
// coalescing key) and runs accept.
type responseCache struct {
	*deps
	coalesce  keyLocks  // see prepare
	hitStores hitStores // cachebudget.go
}

// cacheCall is how one caller uses the cache: what it asks of it, the
// answer's headers (told a miss or a bypass; nil: no HTTP answer), and how
// it serves a hit its tenant's budget allows (served false: not served,
// accept runs).
type cacheCall struct {
	ask   func() (*job.CacheOptions, error)
	h     http.Header
	serve func(p *cache.Plan, e *cache.Entry, age time.Duration) (acc Accepted, served bool, err error)
}

// jobCall is a job envelope's use of the cache (POST /v1/jobs, INTAKE): its
// own cache options, and a hit answered with a result published for the
// job (serveJob).
func jobCall(ctx context.Context, s *responseCache, j *task.Task) cacheCall {
	return cacheCall{
		ask: func() (*job.CacheOptions, error) { return j.Cache, nil },
		serve: func(p *cache.Plan, e *cache.Entry, _ time.Duration) (Accepted, bool, error) {
			return s.serveJob(ctx, p, j, e)
		},
	}
}

// accept runs accept with the cache in front: a hit is served as call
// serves one; otherwise accept runs with j prepared (prepare). It returns
// the request's plan (nil: the cache has nothing to do with it) and
// whether a hit was served. A cache option Sluice cannot honour is a
// *job.ValidationError.
func (s *responseCache) accept(ctx context.Context, j *task.Task, call cacheCall, accept func() (Accepted, error)) (acc Accepted, p *cache.Plan, served bool, err error) {
	j.CacheTarget = nil // never a producer's
	c := s.cfg.Cache
	if c == nil || (j.ID != "" && !job.CanonicalID(j.ID)) {
		acc, err = accept() // which refuses what is wrong
		return acc, nil, false, err
	}
	if _, ok := s.app().Tenant(j.Tenant); !ok {
		acc, err = accept()
		return acc, nil, false, err
	}
	ask, err := call.ask()
	if err == nil {
		p, err = cache.Decide(cache.Request{App: s.app(), Tenant: j.Tenant, Endpoint: j.Endpoint, Ask: ask, Body: j.Request, IdempotencyKey: j.IdempotencyKey})
	}
	if err == nil && p != nil {
		err = keyAllows(ctx, p.Model)
	}
	if err != nil {
		return Accepted{}, nil, false, err
	}
	if p == nil {
		acc, err = accept()
		return acc, nil, false, err
	}
	if e, age, ok := s.cacheGet(ctx, p); ok {
		if acc, served, err = s.hit(ctx, call, p, j.Tenant, e, age); served || err != nil {
			return acc, p, served, err
		}
	}
	if p.Asked && call.h != nil {
		call.h.Set(cache.Header, result(p))
	}
	release, e, age := s.prepare(ctx, p, j)
	defer release()
	if e != nil {
		if acc, served, err = s.hit(ctx, call, p, j.Tenant, e, age); served || err != nil {
			return acc, p, served, err
		}
	}
	acc, err = accept()
	return acc, p, false, err
}

// hit serves a hit as call does, when its tenant's budget allows
// (hitBudget).
func (s *responseCache) hit(ctx context.Context, call cacheCall, p *cache.Plan, tenant string, e *cache.Entry, age time.Duration) (Accepted, bool, error) {
	if err := s.hitBudget(ctx, tenant); err != nil {
		return Accepted{}, false, err
	}
	return call.serve(p, e, age)
}

// serveJob answers a job envelope from the cache entry e, with a result
// published for it. A job
// whose id has a record already is not served: accept knows what a
// repeat is.
func (s *responseCache) serveJob(ctx context.Context, p *cache.Plan, j *task.Task, e *cache.Entry) (acc Accepted, served bool, err error) {
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
func (s *responseCache) cacheGet(ctx context.Context, p *cache.Plan) (*cache.Entry, time.Duration, bool) {
	if !p.Read {
		return nil, 0, false
	}
	ctx, cancel := context.WithTimeout(ctx, cacheRead)
	defer cancel()
	return s.cfg.Cache.Get(ctx, p.Key)
}

// countHit counts a request answered from the cache, and what it did not
// pay for.
func (s *responseCache) countHit(p *cache.Plan, tenant string, e *cache.Entry) {
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
func (s *responseCache) prepare(ctx context.Context, p *cache.Plan, j *task.Task) (release func(), e *cache.Entry, age time.Duration) {
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
func (s *responseCache) cacheAccepted(p *cache.Plan, acc Accepted) {
	if p != nil && p.Coalesce != "" && acc.Joined {
		s.cfg.Cache.Metrics().Coalesced()
	}
}

// cacheAnswered counts the tokens a request that joined an identical call
// did not pay for.
func (s *responseCache) cacheAnswered(p *cache.Plan, acc Accepted, res *job.Result) {
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
func (s *responseCache) freshOp(ctx context.Context, tenant, key string) {
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
			// Ended: its result is stored, or its stream's end marker
			// (published just before the result: a caller whose stream
			// was cut may ask again at once, and must not be handed the
			// cut by joining).
			if _, err := s.mesh.StoredResult(ctx, tenant, rec.JobID); err != nil && !s.mesh.StreamEnded(ctx, tenant, rec.JobID) {
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
func (s *responseCache) coalescing(j *task.Task) (release func()) {
	if s.cfg.Cache == nil || !strings.HasPrefix(j.IdempotencyKey, mesh.CoalescePrefix) {
		return func() {}
	}
	return s.coalesce.lock(j.Tenant + "\x00" + j.IdempotencyKey)
}
