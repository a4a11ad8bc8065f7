package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// pipeline owns submit-and-wait, one path for every surface: the wait and
// a waiter slot (open), then the job through the response cache and
// accept, and its answer (submit): its events relayed as a stream when
// the body asks for one (stream.go), else its result awaited; each
// answered by the request's surface.
type pipeline struct {
	*deps
	acceptor *acceptor
	cache    *responseCache
	limits   *limitView // the limits in effect, for x-ratelimit-* headers
}

// open reads a request's wait (X-Sluice-Wait-Timeout, else the default)
// and takes its tenant's waiter slot before anything is accepted: a
// refusal here leaves no job behind. It answers a refusal itself, through
// sf (ok false); otherwise release gives the slot back.
func (s *pipeline) open(w http.ResponseWriter, r *http.Request, tenant string, sf surface) (wait time.Duration, release func(), ok bool) {
	wait = min(DefaultWait, s.maxWait())
	if v := r.Header.Get("X-Sluice-Wait-Timeout"); v != "" {
		d, err := api.ParseWait(v, s.maxWait(), false)
		if err != nil {
			sf.failed(w, s.failure(w, "openai", &job.ValidationError{Code: job.CodeInvalidRequest, Field: "X-Sluice-Wait-Timeout", Message: err.Error()}))
			return 0, nil, false
		}
		wait = d
	}
	release, ok = s.cfg.Waiters.Acquire(tenant)
	if !ok {
		s.m.JobsRejected.WithLabelValues("openai", api.CodeTooManyWaiters).Inc()
		api.RetryAfter(w, time.Second)
		sf.failed(w, apiError{status: http.StatusTooManyRequests, typ: "sluice_error", code: api.CodeTooManyWaiters, msg: api.TooManyWaitersMessage(s.cfg.Waiters.Max())})
		return 0, nil, false
	}
	return wait, release, true
}

// submit takes a decoded job (body is its chat body as decoded) through
// the response cache and accept, and answers it through sf: a cache hit
// at once, the job's events as a stream when the body asks for one (a
// stream has no overall wait: its deadlines move with each event), else
// its result within wait.
func (s *pipeline) submit(w http.ResponseWriter, r *http.Request, sf surface, j *task.Task, body []byte, wait time.Duration) {
	tenant := j.Tenant
	call := cacheCall{
		ask: func() (*job.CacheOptions, error) { return cache.AskFromHeader(r.Header) },
		h:   w.Header(),
		serve: func(p *cache.Plan, e *cache.Entry, age time.Duration) (Accepted, bool, error) {
			s.cache.countHit(p, tenant, e)
			answerCached(w, sf, p, e, age)
			return Accepted{}, true, nil
		},
	}
	acc, plan, served, err := s.cache.accept(r.Context(), j, call, func() (Accepted, error) { return s.acceptor.acceptHTTP(r, j, body) }) // cache.go
	if served {
		return
	}
	if err != nil {
		sf.failed(w, s.failure(w, "openai", err))
		return
	}
	s.cache.cacheAccepted(plan, acc)
	if !acc.Joined {
		s.m.JobsAccepted.WithLabelValues(tenant, "openai").Inc()
	}
	w.Header().Set("X-Sluice-Job-Id", acc.JobID)
	if stream, usage := wantsStream(body); stream {
		s.streamChat(w, r, j, acc, usage, sf.events(acc.JobID)) // stream.go
		return
	}
	res, ok := s.await(w, r, sf, acc, wait)
	if !ok {
		return
	}
	s.cache.cacheAnswered(plan, acc, res)
	s.resultHeaders(r.Context(), w, res)
	sf.resulted(w.Header(), res)
	writeResult(w, sf, acc.JobID, res)
}

// await waits up to wait for an accepted job's result. It answers a wait
// that ends without one itself, through sf (ok false).
func (s *pipeline) await(w http.ResponseWriter, r *http.Request, sf surface, acc Accepted, wait time.Duration) (res *job.Result, ok bool) {
	api.ExtendDeadlines(w, wait+deadlineSlack)
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	res, err := s.mesh.Wait(ctx, acc.Tenant, acc.JobID)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			// The job goes on: a retry would submit it again (and pay
			// again), so the SDKs are told not to, and where to look.
			api.NoRetry(w)
			sf.failed(w, apiError{status: http.StatusGatewayTimeout, typ: "sluice_error", code: "wait_timeout",
				msg: fmt.Sprintf("no result within %s; job %s goes on: GET /v1/jobs/%s for its result", wait, acc.JobID, acc.JobID)})
			return nil, false
		}
		if r.Context().Err() != nil {
			return nil, false // the caller left; the job goes on
		}
		sf.failed(w, apiError{status: http.StatusServiceUnavailable, typ: "sluice_error", code: "unavailable", msg: "could not wait for the result; the job goes on"})
		return nil, false
	}
	return res, true
}

// answerCached answers from a cache entry as the caller asked, through
// the request's surface: the chat.completion, or its chunks as a stream
// in the surface's events.
func answerCached(w http.ResponseWriter, sf surface, p *cache.Plan, e *cache.Entry, age time.Duration) {
	h := w.Header()
	h.Set(cache.Header, cache.Hit)
	h.Set("Age", strconv.FormatInt(int64(age/time.Second), 10))
	if !p.Stream {
		sf.completed(w, "", e.Response)
		return
	}
	out, f := w, sf.events("")
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
