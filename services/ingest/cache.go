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
	"github.com/sluice-dev/sluice/pkg/job"
)

// cacheRead bounds a cache lookup: past it the request is a miss.
const cacheRead = 2 * time.Second

// cacheBefore runs for a chat request (body as the chat body, j not yet
// accepted): a cache hit is answered here (done is true, as it is for a
// cache header Sluice refuses); otherwise it returns the request's plan
// (nil: the cache has nothing to do with it) and prepares j (prepare).
func (s *Service) cacheBefore(w http.ResponseWriter, r *http.Request, j *job.Job, body []byte) (p *cache.Plan, done bool) {
	j.CacheTarget = nil
	c := s.cfg.Cache
	if c == nil {
		return nil, false
	}
	ask, err := cache.AskFromHeader(r.Header)
	if err == nil {
		p, err = cache.Decide(cache.Request{App: s.cfg.App, Tenant: j.Tenant, Endpoint: j.Endpoint, Ask: ask, Body: body, IdempotencyKey: j.IdempotencyKey})
	}
	if err != nil {
		s.fail(w, "openai", err)
		return nil, true
	}
	if p == nil {
		return nil, false
	}
	if e, age, ok := s.cacheLookup(r.Context(), p); ok {
		s.answerCached(w, p, e, age)
		return nil, true
	}
	if p.Asked {
		w.Header().Set(cache.Header, result(p))
	}
	s.prepare(r.Context(), p, j)
	return p, false
}

// cacheJob runs for a job envelope (POST /v1/jobs, INTAKE) before accept:
// a hit is answered with a result published for the job (served);
// otherwise j is prepared (prepare). A cache option Sluice cannot honour
// is a *job.ValidationError.
func (s *Service) cacheJob(ctx context.Context, j *job.Job) (acc Accepted, served bool, err error) {
	j.CacheTarget = nil // never a producer's
	c := s.cfg.Cache
	if c == nil || (j.ID != "" && !job.CanonicalID(j.ID)) {
		return Accepted{}, false, nil // accept refuses what is wrong
	}
	if _, ok := s.cfg.App.Tenant(j.Tenant); !ok {
		return Accepted{}, false, nil
	}
	p, err := cache.Decide(cache.Request{App: s.cfg.App, Tenant: j.Tenant, Endpoint: j.Endpoint, Ask: j.Cache, Body: j.Request, IdempotencyKey: j.IdempotencyKey})
	if err != nil || p == nil {
		return Accepted{}, false, err
	}
	if e, _, ok := s.cacheLookup(ctx, p); ok {
		if j.ID == "" {
			j.ID = job.NewID()
		}
		// The job's record first, as accept makes it: the job is known
		// (GET /v1/jobs/{id}) from the moment it is acknowledged. An id
		// that has a record already goes through accept, which knows
		// what a repeat is.
		now := s.now().UTC()
		data, _ := json.Marshal(&mesh.Record{JobID: j.ID, Tenant: j.Tenant, Status: job.StatusQueued, SubmittedAt: now})
		rev, err := s.mesh.Results.Create(ctx, keys.Record(j.Tenant, j.ID), data)
		if errors.Is(err, jetstream.ErrKeyExists) {
			s.prepare(ctx, p, j)
			return Accepted{}, false, nil
		}
		if err != nil {
			return Accepted{}, false, &transientError{err}
		}
		res := &job.Result{JobID: j.ID, Tenant: j.Tenant, Status: job.StatusSucceeded, Response: e.Response, Usage: e.Usage,
			Provider: e.Provider, Model: e.Model, SubmittedAt: now, CompletedAt: now}
		if err := s.mesh.PublishResultWith(ctx, res, "", mesh.ResultHints{RecordRev: rev}); err != nil {
			return Accepted{}, false, &transientError{err}
		}
		return Accepted{JobID: j.ID, Tenant: j.Tenant}, true, nil
	}
	s.prepare(ctx, p, j)
	return Accepted{}, false, nil
}

// cacheLookup looks a plan's entry up when it may be read, and counts the
// request: a hit, a miss, or (asked, but not to be read) a bypass.
func (s *Service) cacheLookup(ctx context.Context, p *cache.Plan) (*cache.Entry, time.Duration, bool) {
	c := s.cfg.Cache
	if p.Read {
		ctx, cancel := context.WithTimeout(ctx, cacheRead)
		e, age, ok := c.Get(ctx, p.Key)
		cancel()
		if ok {
			c.Metrics().Request(cache.Hit)
			c.Metrics().Saved(e.Usage)
			return e, age, true
		}
	}
	if p.Asked {
		c.Metrics().Request(result(p))
	}
	return nil, 0, false
}

func result(p *cache.Plan) string {
	if p.Read {
		return cache.Miss
	}
	return cache.Bypass
}

// prepare readies a job the cache did not answer: the executor stores its
// answer at the plan's target, and, when identical requests in flight are
// to share one call, the job takes the plan's coalescing key, so that
// accept joins it to an identical job in flight anywhere in the fleet.
func (s *Service) prepare(ctx context.Context, p *cache.Plan, j *job.Job) {
	j.CacheTarget = p.Target()
	if p.Coalesce != "" && j.IdempotencyKey == "" {
		s.freshOp(ctx, j.Tenant, p.Coalesce)
		j.IdempotencyKey = p.Coalesce
	}
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
		s.cfg.Cache.Metrics().Saved(res.Usage)
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
// requests that coalesce: each joins the operation record by
// compare-and-set, and fifty of them at once would mostly conflict and
// run out of attempts; one after another, each joins at its first.
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
func (s *Service) coalescing(j *job.Job) (release func()) {
	if s.cfg.Cache == nil || !strings.HasPrefix(j.IdempotencyKey, mesh.CoalescePrefix) {
		return func() {}
	}
	return s.coalesce.lock(j.Tenant + "\x00" + j.IdempotencyKey)
}

// acceptCached is accept for a job envelope with the cache in front: a
// hit is answered at once (cacheJob); otherwise accept runs, one at a
// time for identical requests that coalesce.
func (s *Service) acceptCached(ctx context.Context, j *job.Job, accept func() (Accepted, error)) (Accepted, error) {
	acc, served, err := s.cacheJob(ctx, j)
	if err != nil || served {
		return acc, err
	}
	release := s.coalescing(j)
	defer release()
	return accept()
}
