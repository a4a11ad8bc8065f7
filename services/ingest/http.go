package ingest

import (
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
// Each API is a surface (surface.go) on the one submit-and-wait pipeline.
func (s *Service) Routes(mux *http.ServeMux, auth api.Auth) {
	models := &modelsAPI{deps: s.deps, created: s.now().Unix()} // the models' "created"
	jobs := &jobsSurface{deps: s.deps, acceptor: s.acceptor, cache: s.cache}
	chat := chatSurface{deps: s.deps, pipe: s.pipe}
	embeddings := chatSurface{deps: s.deps, pipe: s.pipe, endpoint: job.EndpointEmbeddings}
	messages := messagesSurface{deps: s.deps, pipe: s.pipe}
	responses := responsesSurface{deps: s.deps, pipe: s.pipe}
	for _, rt := range []struct {
		pattern string
		handle  func(http.ResponseWriter, *http.Request, api.Auth)
	}{
		{"POST /v1/jobs", jobs.postJob},
		{"POST /v1/chat/completions", chat.serve},
		{"GET /v1/models", models.listModels},
		{"GET /v1/models/{id...}", models.getModel},
		{"POST /v1/embeddings", embeddings.serve},
		{"POST /v1/messages", messages.serve},
		{"POST /v1/responses", responses.responses},
		{"GET /v1/responses/{id}", responses.getResponse},
		{"DELETE /v1/responses/{id}", responses.deleteResponse},
		{"GET /v1/responses/{id}/input_items", responses.inputItems}, // input_items.go
	} {
		mux.HandleFunc(rt.pattern, func(w http.ResponseWriter, r *http.Request) { rt.handle(w, auth.Scoped(r), auth) })
	}
}

// DefaultWait bounds how long /v1/chat/completions waits for a result when
// the caller sets no X-Sluice-Wait-Timeout.
const DefaultWait = 10 * time.Minute

func (s *deps) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
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

// jobsSurface is the jobs API (POST /v1/jobs): the body is a job
// envelope, accepted through the response cache; nothing is waited for.
type jobsSurface struct {
	*deps
	acceptor *acceptor
	cache    *responseCache
}

// POST /v1/jobs: the body is a job envelope; 202 with the job id.
func (s *jobsSurface) postJob(w http.ResponseWriter, r *http.Request, auth api.Auth) {
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
	acc, _, _, err := s.cache.accept(r.Context(), j, jobCall(r.Context(), s.cache, j), func() (Accepted, error) { return s.acceptor.acceptHTTP(r, j, body) }) // cache.go
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

// chatSurface is OpenAI's chat completions (and embeddings, endpoint
// job.EndpointEmbeddings): the body is the job's request as it came, the
// answer the provider's, errors and events OpenAI's.
type chatSurface struct {
	*deps
	pipe     *pipeline
	endpoint string
}

// POST /v1/chat/completions: OpenAI-compatible; waits for the result.
//
// POST /v1/embeddings: OpenAI-compatible, through the same queue,
// admission and executor path as chat. The job is charged its input
// tokens, counted with the model's tokenizer; an array input is one
// request (one provider call, up to job.MaxEmbeddingInputs inputs), as
// OpenAI's API takes it. Headers and errors are as for chat completions.
func (s chatSurface) serve(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	tenant, err := auth.Tenant(r)
	if err != nil {
		s.fail(w, "openai", err)
		return
	}
	wait, release, ok := s.pipe.open(w, r, tenant, s)
	if !ok {
		return
	}
	defer release()
	body, err := s.readBody(w, r)
	if err != nil {
		s.fail(w, "openai", err)
		return
	}
	j, err := decodeChat(r, tenant, body, s.endpoint)
	if err != nil {
		s.fail(w, "openai", err)
		return
	}
	s.pipe.submit(w, r, s, j, body, wait)
}

func (chatSurface) completed(w http.ResponseWriter, _ string, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

func (chatSurface) failed(w http.ResponseWriter, e apiError) { writeOpenAIError(w, e) }
func (chatSurface) resulted(http.Header, *job.Result)        {}
func (chatSurface) events(string) eventFormat                { return openAIEvents{} }

// decodeChat is the job of a chat body (as it came, or as a surface
// translated it) for endpoint, once it is checked as JSON (checkBody).
func decodeChat(r *http.Request, tenant string, body []byte, endpoint string) (*task.Task, error) {
	if !json.Valid(body) {
		return nil, &job.ValidationError{Code: job.CodeInvalidRequest, Message: "body is not valid JSON"}
	}
	if err := checkBody(body, endpoint); err != nil { // input.go
		return nil, err
	}
	return chatJob(r, tenant, body, endpoint)
}

// chatJob is the job of an OpenAI-compatible request: its body and what
// the Sluice headers ask of it (priority, deadline, cost).
func chatJob(r *http.Request, tenant string, body []byte, endpoint string) (*task.Task, error) {
	j := &task.Task{
		Job: job.Job{Tenant: tenant, Endpoint: endpoint, Request: body, IdempotencyKey: r.Header.Get("Idempotency-Key"), Provider: r.Header.Get("X-Sluice-Provider"), Affinity: r.Header.Get("X-Sluice-Affinity")},
	}
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

func (s *deps) maxWait() time.Duration {
	if d := s.app().Limits.MaxWait.D(); d > 0 {
		return d
	}
	return config.DefaultMaxWait
}

// WriteOpenAIResult answers in OpenAI's shape: the provider's body on
// success, an OpenAI error otherwise.
func WriteOpenAIResult(w http.ResponseWriter, res *job.Result) {
	writeResult(w, chatSurface{}, res.JobID, res)
}

// writeResult answers with a job's result in sf's shapes (jobID is the
// job the request was answered by).
func writeResult(w http.ResponseWriter, sf surface, jobID string, res *job.Result) {
	if res.Status == job.StatusSucceeded && len(res.Response) > 0 {
		sf.completed(w, jobID, res.Response)
		return
	}
	sf.failed(w, resultError(w, res))
}

// resultError is a job that did not succeed, as an error answer.
func resultError(w http.ResponseWriter, res *job.Result) apiError {
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
	return apiError{status: status, typ: "sluice_" + string(res.Status), code: code, msg: msg}
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

// fail answers err in OpenAI's shape (failure).
func (s *deps) fail(w http.ResponseWriter, via string, err error) {
	writeOpenAIError(w, s.failure(w, via, err))
}

// failure is err as an error answer, counted as a job refused via via; it
// sets the answer's headers (Retry-After, X-Should-Retry). Every surface
// renders it in its API's shape.
func (s *deps) failure(w http.ResponseWriter, via string, err error) apiError {
	var ve *job.ValidationError
	switch {
	case errors.Is(err, api.ErrUnauthorized):
		s.m.JobsRejected.WithLabelValues(via, "unauthorized").Inc()
		return apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key", msg: err.Error()}
	case errors.As(err, &ve) && ve.Code == CodeDeadlineUnmeetable:
		s.m.JobsRejected.WithLabelValues(via, ve.Code).Inc()
		return apiError{status: http.StatusTooManyRequests, typ: "invalid_request_error", code: ve.Code, msg: ve.Error()}
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
		return apiError{status: api.StatusFor(ve.Code), typ: "invalid_request_error", code: ve.Code, param: param, msg: msg}
	case errors.Is(err, ErrQueueFull):
		be := &BusyError{Code: job.CodeQueueFull, RetryAfter: 2 * time.Second, Message: "Sluice's queue is full"}
		errors.As(err, &be)
		s.m.JobsRejected.WithLabelValues(via, be.Code).Inc()
		return busyError(w, be)
	default:
		s.log.Warn("http submit failed", "err", err)
		api.RetryAfter(w, time.Second)
		return apiError{status: http.StatusServiceUnavailable, typ: "sluice_error", code: "unavailable", msg: "could not accept the job now (the cluster has not taken it within " + ElectionWait.String() + "); retry with an Idempotency-Key, so that a retry cannot make a second job"}
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
