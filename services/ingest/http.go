package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Routes registers ingest's HTTP API on mux: every endpoint, in one table.
func (s *Service) Routes(mux *http.ServeMux, auth api.Auth) {
	started := s.now().Unix() // the models' "created"
	listModels := func(w http.ResponseWriter, r *http.Request, a api.Auth) { s.listModels(w, r, a, started) }
	getModel := func(w http.ResponseWriter, r *http.Request, a api.Auth) { s.getModel(w, r, a, started) }
	for _, rt := range []struct {
		pattern string
		handle  func(http.ResponseWriter, *http.Request, api.Auth)
	}{
		{"POST /v1/jobs", s.postJob},
		{"POST /v1/chat/completions", s.chat},
		{"GET /v1/models", listModels},
		{"GET /v1/models/{id...}", getModel},
		{"POST /v1/embeddings", s.embeddings},
		{"POST /v1/messages", s.messages},
		{"POST /v1/responses", s.responses},
		{"GET /v1/responses/{id}", s.getResponse},
		{"DELETE /v1/responses/{id}", s.deleteResponse},
		{"GET /v1/responses/{id}/input_items", s.inputItems}, // input_items.go
	} {
		mux.HandleFunc(rt.pattern, func(w http.ResponseWriter, r *http.Request) { rt.handle(w, auth.Scoped(r), auth) })
	}
}

// DefaultWait bounds how long /v1/chat/completions waits for a result when
// the caller sets no X-Sluice-Wait-Timeout.
const DefaultWait = 10 * time.Minute

func (s *Service) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if err := checkContentType(r); err != nil {
		return nil, err
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.lim.MaxBodyBytes)))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &job.ValidationError{Code: job.CodeTooLarge, Message: fmt.Sprintf("body is over the %d-byte limit", s.lim.MaxBodyBytes)}
		}
		return nil, &job.ValidationError{Code: job.CodeInvalidRequest, Message: "could not read body"}
	}
	if err := checkUTF8(body); err != nil {
		return nil, err
	}
	return body, nil
}

// POST /v1/jobs: the body is a job envelope; 202 with the job id.
func (s *Service) postJob(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	tenant, err := auth.Tenant(r)
	if err != nil {
		s.fail(w, "http", err)
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.fail(w, "http", err)
		return
	}
	env, err := job.Parse(body, s.lim) // accept checks it
	if err != nil {
		s.fail(w, "http", err)
		return
	}
	j := task.New(*env)
	if j.Tenant == "" {
		j.Tenant = tenant
	}
	if j.Tenant != tenant {
		s.fail(w, "http", &job.ValidationError{Code: job.CodeUnknownTenant, Field: "tenant", Message: "does not match the API key's tenant"})
		return
	}
	if k := r.Header.Get("Idempotency-Key"); k != "" && j.IdempotencyKey == "" {
		j.IdempotencyKey = k
	}
	acc, err := s.acceptCached(r.Context(), j, func() (Accepted, error) { return s.acceptHTTP(r, j, body) }) // cache.go
	if err != nil {
		s.fail(w, "http", err)
		return
	}
	if !acc.Joined {
		s.m.JobsAccepted.WithLabelValues(tenant, "http").Inc()
	}
	w.Header().Set("Location", "/v1/jobs/"+acc.JobID)
	api.JSON(w, http.StatusAccepted, map[string]any{"id": acc.JobID, "tenant": acc.Tenant, "status": job.StatusQueued, "joined": acc.Joined})
}

// POST /v1/chat/completions: OpenAI-compatible; waits for the result.
func (s *Service) chat(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	tenant, err := auth.Tenant(r)
	if err != nil {
		s.fail(w, "openai", err)
		return
	}
	wait := min(DefaultWait, s.maxWait())
	if v := r.Header.Get("X-Sluice-Wait-Timeout"); v != "" {
		d, err := api.ParseWait(v, s.maxWait(), false)
		if err != nil {
			s.fail(w, "openai", &job.ValidationError{Code: job.CodeInvalidRequest, Field: "X-Sluice-Wait-Timeout", Message: err.Error()})
			return
		}
		wait = d
	}
	// A waiter slot before anything is accepted: a refusal here leaves no
	// job behind.
	release, ok := s.cfg.Waiters.Acquire(tenant)
	if !ok {
		s.m.JobsRejected.WithLabelValues("openai", api.CodeTooManyWaiters).Inc()
		api.TooManyWaiters(w, s.cfg.Waiters.Max())
		return
	}
	defer release()
	body, err := s.readBody(w, r)
	if err != nil {
		s.fail(w, "openai", err)
		return
	}
	if !json.Valid(body) {
		s.fail(w, "openai", &job.ValidationError{Code: job.CodeInvalidRequest, Message: "body is not valid JSON"})
		return
	}
	if err := checkBody(r.Context(), body); err != nil { // input.go
		s.fail(w, "openai", err)
		return
	}
	j, err := chatJob(r, tenant, body)
	if err != nil {
		s.fail(w, "openai", err)
		return
	}
	plan, done := s.cacheBefore(w, r, j, body) // cache.go
	if done {
		return
	}
	acc, done, err := s.cacheAccept(w, r, plan, j, func() (Accepted, error) { return s.acceptHTTP(r, j, body) }) // cache.go
	if done {
		return
	}
	if err != nil {
		s.fail(w, "openai", err)
		return
	}
	s.cacheAccepted(plan, acc)
	if !acc.Joined {
		s.m.JobsAccepted.WithLabelValues(tenant, "openai").Inc()
	}
	w.Header().Set("X-Sluice-Job-Id", acc.JobID)
	if stream, usage := wantsStream(body); stream {
		// A stream has no overall wait: its deadlines move with each
		// event (stream.go).
		out, f := w, eventFormat(openAIEvents{})
		if c, ok := w.(*captured); ok && c.stream != nil { // POST /v1/messages, /v1/responses
			out, f = c.beginStream(), c.stream
		}
		s.streamChat(out, r, j, acc, usage, f) // stream.go
		return
	}
	api.ExtendDeadlines(w, wait+deadlineSlack)
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	res, err := s.mesh.Wait(ctx, tenant, acc.JobID)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			// The job goes on: a retry would submit it again (and pay
			// again), so the SDKs are told not to, and where to look.
			api.NoRetry(w)
			api.Error(w, http.StatusGatewayTimeout, "sluice_error", "wait_timeout",
				fmt.Sprintf("no result within %s; job %s goes on: GET /v1/jobs/%s for its result", wait, acc.JobID, acc.JobID))
			return
		}
		if r.Context().Err() != nil {
			return // the caller left; the job goes on
		}
		api.Error(w, http.StatusServiceUnavailable, "sluice_error", "unavailable", "could not wait for the result; the job goes on")
		return
	}
	s.cacheAnswered(plan, acc, res)
	s.resultHeaders(r.Context(), w, res)
	WriteOpenAIResult(w, res)
}

// chatJob is the job of an OpenAI-compatible request: its body and what
// the Sluice headers ask of it (priority, deadline, cost).
func chatJob(r *http.Request, tenant string, body []byte) (*task.Task, error) {
	j := task.New(job.Job{Tenant: tenant, Endpoint: endpointOf(r.Context()), Request: body, IdempotencyKey: r.Header.Get("Idempotency-Key"),
		Provider: r.Header.Get("X-Sluice-Provider"), Affinity: r.Header.Get("X-Sluice-Affinity")})
	if p := r.Header.Get("X-Sluice-Priority"); p != "" {
		j.Priority = job.Priority(strings.ToLower(p))
	}
	if v := r.Header.Get("X-Sluice-Deadline"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return nil, &job.ValidationError{Code: job.CodeInvalidRequest, Field: "X-Sluice-Deadline", Message: "must be an RFC 3339 time"}
		}
		j.Deadline = &t
	}
	if v := r.Header.Values(CostHeader); len(v) > 0 {
		c, err := ParseCost(strings.Join(v, ","))
		if err != nil {
			return nil, err
		}
		j.Cost = c
	}
	return j, nil
}

// deadlineSlack is what a waiting request's connection deadlines allow
// beyond its wait, to write the answer.
const deadlineSlack = 30 * time.Second

func (s *Service) maxWait() time.Duration {
	if d := s.app().Limits.MaxWait.D(); d > 0 {
		return d
	}
	return config.DefaultMaxWait
}

// WriteOpenAIResult answers in OpenAI's shape: the provider's body on
// success, an OpenAI error otherwise.
func WriteOpenAIResult(w http.ResponseWriter, res *job.Result) {
	if res.Status == job.StatusSucceeded && len(res.Response) > 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(res.Response)
		return
	}
	code, msg := string(res.Status), "the job did not succeed"
	if res.Error != nil {
		code, msg = res.Error.Code, res.Error.Message
	}
	status := failureStatus(res.Status, code)
	// The job is over: Sluice already retried what could be retried, and
	// an SDK that retries this answer submits a new job and pays again.
	api.NoRetry(w)
	w.Header().Set("X-Sluice-Job-Id", res.JobID)
	setDeployment(w.Header(), res)
	api.Error(w, status, "sluice_"+string(res.Status), code, msg)
}

// failureStatus is the HTTP status of a job that ended with status and
// error code code.
func failureStatus(status job.Status, code string) int {
	switch {
	case status == job.StatusExpired:
		return http.StatusGatewayTimeout
	case code == job.CodeDeploymentUnreachable:
		return http.StatusServiceUnavailable // the deployment's problem
	case code == job.CodeDeploymentAuth || provider.OperatorCode(code):
		return http.StatusBadGateway // the deployment's problem
	case status == job.StatusFailed:
		st := api.StatusFor(code)
		if st == http.StatusBadRequest && !strings.HasPrefix(code, "invalid") && code != job.CodeUnsupported && code != "context_length_exceeded" {
			return http.StatusBadGateway
		}
		return st
	}
	return http.StatusBadGateway
}

func (s *Service) fail(w http.ResponseWriter, via string, err error) {
	var ve *job.ValidationError
	switch {
	case errors.Is(err, api.ErrUnauthorized):
		s.m.JobsRejected.WithLabelValues(via, "unauthorized").Inc()
		api.Error(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", err.Error())
	case errors.As(err, &ve) && ve.Code == CodeDeadlineUnmeetable:
		s.m.JobsRejected.WithLabelValues(via, ve.Code).Inc()
		api.Error(w, http.StatusTooManyRequests, "invalid_request_error", ve.Code, ve.Error())
	case errors.As(err, &ve):
		// The caller's own mistake: the same request fails the same way,
		// a deadline already past included (400, not a 504 the SDKs
		// would send again).
		s.m.JobsRejected.WithLabelValues(via, ve.Code).Inc()
		api.NoRetry(w)
		msg, param := ve.Error(), api.Param(ve.Field)
		if via != "http" { // the provider APIs name the body's own fields, not the job envelope's
			msg, param = ve.Message, apiField(ve.Field)
			if param != "" {
				msg = param + ": " + ve.Message
			}
		}
		api.ErrorParam(w, api.StatusFor(ve.Code), "invalid_request_error", ve.Code, param, msg)
	case errors.Is(err, ErrQueueFull):
		be := &BusyError{Code: job.CodeQueueFull, RetryAfter: 2 * time.Second, Message: "Sluice's queue is full"}
		errors.As(err, &be)
		s.m.JobsRejected.WithLabelValues(via, be.Code).Inc()
		writeBusy(w, be)
	default:
		s.log.Warn("http submit failed", "err", err)
		api.RetryAfter(w, time.Second)
		api.Error(w, http.StatusServiceUnavailable, "sluice_error", "unavailable", "could not accept the job now (the cluster has not taken it within "+ElectionWait.String()+"); retry with an Idempotency-Key, so that a retry cannot make a second job")
	}
}

// apiField is what a caller of a provider API (chat, messages, responses)
// knows a job field by: the body's own path for the request's fields, the
// header that set an envelope field, nothing for the envelope itself.
func apiField(field string) string {
	switch field {
	case "request", "tenant", "id", "task", "endpoint":
		return ""
	case "deadline":
		return "X-Sluice-Deadline"
	case "priority":
		return "X-Sluice-Priority"
	case "idempotency_key":
		return "Idempotency-Key"
	case "provider":
		return "X-Sluice-Provider"
	case "cost":
		return CostHeader
	}
	return api.Param(field)
}
