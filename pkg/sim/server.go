package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
)

// maxBodyBytes bounds a chat-completions body.
const maxBodyBytes = 32 << 20

// Server is a simulated provider. It is an http.Handler; all methods are
// safe for concurrent use.
type Server struct {
	cfg         Config
	form        headerForm
	keys        map[string]bool
	quotaModels map[string]bool
	quotaKeys   map[string]bool
	reasoning   map[string]bool
	filler      filler
	gen         atomic.Pointer[generation]
	anth        atomic.Pointer[anthropicState] // /v1/messages (anthropic.go)
	batch       atomic.Pointer[batchState]     // the Batch APIs (batch.go)
	rec         recorder                       // Requests (responses.go)
}

// New validates cfg, fills in its defaults and returns a simulator.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	s := &Server{
		cfg:         cfg,
		form:        formOf(cfg),
		keys:        set(cfg.APIKeys),
		quotaModels: set(cfg.Faults.QuotaModels),
		quotaKeys:   set(cfg.Faults.QuotaKeys),
		reasoning:   map[string]bool{},
		filler:      newFiller(),
	}
	for _, m := range cfg.Models {
		s.reasoning[m.Name] = m.Reasoning
	}
	s.Reset()
	return s, nil
}

func set(items []string) map[string]bool {
	m := make(map[string]bool, len(items))
	for _, it := range items {
		m[it] = true
	}
	return m
}

// Handler returns s as an http.Handler.
func (s *Server) Handler() http.Handler { return s }

// Stats returns a snapshot of the counters and windows.
func (s *Server) Stats() Stats {
	st := s.gen.Load().snapshot(s.cfg.Now())
	st.Profile = s.cfg.Profile
	return st
}

// Reset clears every counter, window, timeline and the idempotency ledger,
// and restarts the fault sequence. Requests in flight finish against the
// state they started with and do not show in the new one.
func (s *Server) Reset() {
	s.gen.Store(newGeneration(s.cfg.Now(), s.cfg))
	s.anth.Store(newAnthropicState(s.cfg.Now().UnixNano(), s.cfg))
	s.batch.Store(newBatchState())
}

// ServeHTTP routes:
//
//	POST /v1/chat/completions, /chat/completions  chat completions (n choices)
//	POST /v1/embeddings, /embeddings              embeddings, charged by input tokens
//	POST /v1/messages, /messages                  Anthropic's Messages API (anthropic.go)
//	POST /v1/responses, /responses                OpenAI's Responses API, unless Config.NoResponses (responses.go)
//	GET  /v1/models, /models                      the configured models
//	POST /v1/files, GET /v1/files/{id}[/content]  OpenAI's files, for its Batch API (batch_openai.go)
//	POST /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel
//	                                              OpenAI's Batch API (batch_openai.go)
//	POST /v1/messages/batches, GET .../{id}[/results], POST .../{id}/cancel
//	                                              Anthropic's Message Batches (batch_anthropic.go)
//	GET  /stats                                   Stats as JSON (?summary=1: no per-key maps or timelines)
//	GET  /stats/batches                           the Batch APIs' ledger, {"lines": BatchLines()}
//	POST /reset                                   Reset
//
// Under ProfileAzure, Azure's calls too (azure.go).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Profile == ProfileAzure && s.serveAzure(w, r) { // azure.go
		return
	}
	switch r.URL.Path {
	case "/v1/chat/completions", "/chat/completions":
		if s.allow(w, r, http.MethodPost) {
			s.serveCall(w, r, s.parseChat)
		}
	case "/v1/embeddings", "/embeddings":
		if s.allow(w, r, http.MethodPost) {
			s.serveCall(w, r, s.parseEmbeddings)
		}
	case "/v1/messages", "/messages":
		s.serveMessages(w, r)
	case "/v1/responses", "/responses":
		if s.cfg.NoResponses {
			s.unknownURL(w, r)
		} else if s.allow(w, r, http.MethodPost) {
			s.serveCall(w, r, s.parseResponses)
		}
	case "/v1/models", "/models":
		if s.allow(w, r, http.MethodGet) {
			s.listModels(w, r)
		}
	case "/stats":
		if s.allow(w, r, http.MethodGet) {
			s.serveStats(w, r)
		}
	case "/stats/batches":
		if s.allow(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, map[string]any{"lines": s.BatchLines()})
		}
	case "/reset":
		if s.allow(w, r, http.MethodPost) {
			s.Reset()
			w.WriteHeader(http.StatusNoContent)
		}
	default:
		if !s.serveBatch(w, r) {
			s.unknownURL(w, r)
		}
	}
}

func (s *Server) unknownURL(w http.ResponseWriter, r *http.Request) {
	s.fail(w, s.gen.Load(), nil, http.StatusNotFound, apiError{
		Message: fmt.Sprintf("Unknown request URL: %s %s.", r.Method, r.URL.Path),
		Type:    "invalid_request_error",
		Code:    "unknown_url",
	})
}

func (s *Server) allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method {
		return true
	}
	w.Header().Set("Allow", method)
	s.fail(w, s.gen.Load(), nil, http.StatusMethodNotAllowed, apiError{
		Message: fmt.Sprintf("Method %s is not allowed on %s; use %s.", r.Method, r.URL.Path, method),
		Type:    "invalid_request_error",
	})
	return false
}

// call is one parsed chat-completions or embeddings request.
type call struct {
	model  string
	body   []byte
	prompt int
	maxOut int // per choice
	n      int // choices
	cost   int64
	key    string // Idempotency-Key
	jobID  string // X-Sluice-Job-Id
	// embed is set for an embeddings call (no output tokens).
	embed  *job.EmbeddingsRequest
	stream bool // stream: true
	usage  bool // stream_options.include_usage
	// reasoning: a reasoning model's call (ModelLimits.Reasoning).
	reasoning bool
	// arrived is when the request reached the server (Server.now), 0 for
	// the instant it is charged.
	arrived int64
	// responses: a Responses API call (responses.go); tool: the tool call
	// it is answered with, if any.
	responses bool
	tool      *toolCall
	// content: the answer's text when the request's response_format fixes
	// it (schema.go); nil: filler.
	content *string
	// before: a Responses call's output items ahead of its answer (a
	// reasoning model's reasoning, a web search's call).
	before []map[string]any
}

// serveCall answers a chat-completions or embeddings request: parse reads
// the body into a call, which is then charged against its model's limits
// like any other.
func (s *Server) serveCall(w http.ResponseWriter, r *http.Request, parse func([]byte) (*call, error)) {
	g := s.gen.Load()
	apiKey, ok := s.authorize(w, r, g)
	if !ok {
		return
	}
	// The limits judge the instant the request arrived, not the instant
	// this process got round to reading and parsing it: on a loaded
	// machine that took up to 12 ms, and a call sent within its
	// tolerance was judged late.
	arrived := s.now()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		s.failRead(w, g, err)
		return
	}
	s.rec.add(r.URL.Path, body)
	c, err := parse(body)
	if c != nil {
		c.arrived = arrived
	}
	if err != nil {
		s.fail(w, g, nil, http.StatusBadRequest, invalidRequest(err))
		return
	}
	c.body, c.key, c.jobID = body, r.Header.Get("Idempotency-Key"), r.Header.Get("X-Sluice-Job-Id")
	m := g.models[c.model]
	if m == nil {
		s.fail(w, g, nil, http.StatusNotFound, apiError{
			Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", c.model),
			Type:    "invalid_request_error",
			Code:    "model_not_found",
		})
		return
	}
	if s.quotaModels[c.model] || s.quotaKeys[apiKey] {
		m.peek(s.now()).set(w.Header(), s.form)
		s.fail(w, g, m, http.StatusTooManyRequests, apiError{
			Message: "You exceeded your current quota, please check your plan and billing details.",
			Type:    "insufficient_quota",
			Code:    "insufficient_quota",
		})
		return
	}
	if c.key == "" || s.cfg.IgnoreIdempotencyKey {
		s.execute(w, r, g, m, c, nil)
		return
	}
	s.idempotent(w, r, g, m, c)
}

// parseChat reads a chat-completions body: charged prompt + n x max output.
func (s *Server) parseChat(body []byte) (*call, error) {
	req, err := job.ParseRequest(body, job.Limits{})
	if err != nil {
		return nil, err
	}
	c := &call{model: req.Model, prompt: s.cfg.Count.Prompt(req), maxOut: req.OutputLimit(s.cfg.DefaultMaxTokens), n: req.Choices(),
		stream: req.Stream, usage: req.WantsUsage(), reasoning: s.reasoning[req.Model], tool: s.chatTool(body), content: jsonAnswer(body)}
	if c.reasoning {
		if err := checkReasoning(body); err != nil {
			return nil, err
		}
	}
	c.cost = int64(c.prompt) + int64(c.n)*int64(c.maxOut)
	return c, nil
}

// parseEmbeddings reads an embeddings body: charged its input tokens.
func (s *Server) parseEmbeddings(body []byte) (*call, error) {
	req, err := job.ParseEmbeddings(body)
	if err != nil {
		return nil, err
	}
	c := &call{model: req.Model, prompt: s.cfg.Count.Embeddings(req), n: 1, embed: req}
	c.cost = int64(c.prompt)
	return c, nil
}

// idempotent runs c once per Idempotency-Key: the first request with the
// key runs it, later ones wait for that and replay its response. If the
// running one fails, a waiter takes the key over and runs it itself.
func (s *Server) idempotent(w http.ResponseWriter, r *http.Request, g *generation, m *modelState, c *call) {
	for {
		e, owner := g.claim(c.key)
		if owner {
			s.execute(w, r, g, m, c, e)
			return
		}
		select {
		case <-e.done:
		case <-r.Context().Done():
			return
		}
		c.arrived = 0 // one that takes the key over is charged when it runs
		if e.resp != nil {
			if c.stream {
				s.replayStream(w, g, m, c, e.resp)
				return
			}
			s.replay(w, g, m, e.resp)
			return
		}
	}
}

// execute charges c and, if admitted and not faulted, completes it. e is
// the ledger entry c owns, if it has an Idempotency-Key.
func (s *Server) execute(w http.ResponseWriter, r *http.Request, g *generation, m *modelState, c *call, e *entry) {
	var day *dayQuota
	if q := m.day; q != nil {
		// The day's quota is judged first and charged only once the rate
		// limits admit the request: one step, under its lock.
		at := c.arrived
		if at == 0 {
			at = s.now()
		}
		q.mu.Lock()
		ok, dim, limit, used, wait := q.check(at, c.cost)
		if !ok {
			q.mu.Unlock()
			g.release(c.key, e)
			m.refusedBeyondWindows(at)
			if s.cfg.OnArrival != nil {
				s.cfg.OnArrival(Arrival{Model: c.model, JobID: c.jobID, IdempotencyKey: c.key, At: time.Unix(0, at), Cost: c.cost, Body: c.body, Limit: dayLimitNames[dim]})
			}
			m.peek(at).set(w.Header(), s.form)
			s.refuseDay(w, g, m, c, dim, limit, used, wait)
			return
		}
		day = q
	}
	d, unitErr := s.admit(m, c)
	if day != nil {
		if d.admitted {
			day.charge(d.at, c.cost)
		}
		day.mu.Unlock()
	}
	if s.cfg.OnArrival != nil {
		a := Arrival{Model: c.model, JobID: c.jobID, IdempotencyKey: c.key, At: time.Unix(0, d.at), Cost: c.cost, Body: c.body, Admitted: d.admitted}
		switch {
		case d.admitted:
		case unitErr != nil:
			a.Limit = unitErr.Type
		case d.tooLarge:
			a.Limit = reasonNames[reasonTooLarge]
		default:
			a.Limit = reasonNames[d.reason]
		}
		s.cfg.OnArrival(a)
	}
	d.rate.set(w.Header(), s.form)
	if !d.admitted {
		g.release(c.key, e)
		if unitErr != nil {
			s.failUnit(w, g, m, d, unitErr)
			return
		}
		if !d.tooLarge {
			setRetryAfter(w.Header(), d.retry)
		}
		s.fail(w, g, m, http.StatusTooManyRequests, rateLimitError(c.model, d, m.lim, s.cfg.Profile == ProfileHidden))
		return
	}
	f := s.fault(g, c.stream)
	switch f {
	case noFault:
	case faultStreamCut, faultStreamStall:
		s.streamCompletion(w, r, g, m, c, e, d.at, f)
		return
	default:
		g.release(c.key, e)
		s.inject(w, r, g, m, f)
		return
	}
	if c.stream {
		s.streamCompletion(w, r, g, m, c, e, d.at, noFault)
		return
	}
	s.complete(w, r, g, m, c, e, d.at)
}

// complete does an admitted call's work: waits out its latency, records the
// completion (even if the client has gone: the provider did the work) and
// answers.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, g *generation, m *modelState, c *call, e *entry, arrival int64) {
	var resp any
	completion := 0 // per choice
	switch {
	case c.embed != nil:
		resp = newEmbeddings(c)
	case c.responses:
		completion = min(max(s.cfg.OutputTokens(c.maxOut, c.body), 0), c.maxOut)
		resp = s.newResponse(c, completion)
	default:
		completion = min(max(s.cfg.OutputTokens(c.maxOut, c.body), 0), c.maxOut)
		resp = s.newCompletion(c, completion, s.cfg.Now())
	}
	body, err := json.Marshal(resp)
	if err != nil { // only our own types are encoded
		panic(fmt.Sprintf("sim: encoding completion: %v", err))
	}
	delivered := sleep(r.Context(), s.cfg.TTFT+time.Duration(completion)*s.cfg.PerToken)
	m.succeeded(arrival, c.cost, int64(c.prompt+c.n*completion))
	g.complete(c.key, c.jobID, e, body)
	if !delivered {
		g.clientGone.Add(1)
		return
	}
	w.Header().Set("x-request-id", "req_"+randomID(24))
	s.count(g, m, http.StatusOK)
	writeBody(w, http.StatusOK, body)
}

// sleep waits d or until ctx ends, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return ctx.Err() == nil
}

// fault rolls the fault of the next admitted request; stream faults apply
// only to streamed requests, and at most Faults.MaxFaults are injected.
func (s *Server) fault(g *generation, stream bool) fault {
	if !s.cfg.Faults.any() {
		return noFault
	}
	f := s.cfg.Faults.roll(g.faultSeq.Add(1))
	if !stream && (f == faultStreamCut || f == faultStreamStall) {
		return noFault
	}
	if f != noFault && s.cfg.Faults.MaxFaults > 0 && g.faults.Add(1) > int64(s.cfg.Faults.MaxFaults) {
		return noFault
	}
	return f
}

// inject answers an admitted request with fault f.
func (s *Server) inject(w http.ResponseWriter, r *http.Request, g *generation, m *modelState, f fault) {
	switch f {
	case faultReset:
		g.connResets.Add(1)
		dropConnection(w)
	case faultHang:
		g.hangs.Add(1)
		hang(r.Context(), w, s.cfg.Faults.HangFor)
	default:
		status, body := f.serverError()
		s.fail(w, g, m, status, body)
	}
}

// replay answers with a stored response without charging anything.
func (s *Server) replay(w http.ResponseWriter, g *generation, m *modelState, body []byte) {
	h := w.Header()
	m.peek(s.now()).set(h, s.form)
	h.Set("Idempotent-Replayed", "true")
	g.replayed.Add(1)
	s.count(g, m, http.StatusOK)
	writeBody(w, http.StatusOK, body)
}

// authorize checks the bearer key, answering 401 itself when it fails, and
// returns the key.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, g *generation) (string, bool) {
	if s.cfg.Profile == ProfileAzure && strings.HasPrefix(r.URL.Path, AzurePathPrefix) {
		return s.authorizeAzure(w, g, r)
	}
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	key = strings.TrimSpace(key)
	if len(s.keys) == 0 || s.keys[key] {
		return key, true
	}
	msg := "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
	if key != "" {
		msg = "Incorrect API key provided: " + redact(key) + "."
	}
	s.fail(w, g, nil, http.StatusUnauthorized, apiError{Message: msg, Type: "invalid_request_error", Code: "invalid_api_key"})
	return "", false
}

func redact(key string) string {
	if len(key) < 12 {
		return "****"
	}
	return key[:3] + "*****" + key[len(key)-4:]
}

func (s *Server) failRead(w http.ResponseWriter, g *generation, err error) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		s.fail(w, g, nil, http.StatusRequestEntityTooLarge, apiError{
			Message: fmt.Sprintf("Request body is larger than %d bytes.", tooBig.Limit),
			Type:    "invalid_request_error",
		})
		return
	}
	s.fail(w, g, nil, http.StatusBadRequest, apiError{Message: "Could not read the request body.", Type: "invalid_request_error"})
}

// invalidRequest converts a job.ParseRequest error into OpenAI's shape.
func invalidRequest(err error) apiError {
	e := apiError{Message: err.Error(), Type: "invalid_request_error"}
	var ve *job.ValidationError
	if !errors.As(err, &ve) {
		return e
	}
	e.Param = strings.TrimPrefix(strings.TrimPrefix(ve.Field, "request"), ".")
	e.Message = ve.Message
	if e.Param != "" {
		e.Message = e.Param + ": " + ve.Message
	}
	if ve.Code == job.CodeUnsupported {
		e.Code = "unsupported_value"
	}
	return e
}

// fail writes an error response and counts it.
func (s *Server) fail(w http.ResponseWriter, g *generation, m *modelState, status int, e apiError) {
	s.count(g, m, status)
	writeJSON(w, status, e)
}

func (s *Server) count(g *generation, m *modelState, status int) {
	g.status.add(status)
	if m != nil {
		m.status.add(status)
	}
}

// now is the arrival instant in unix nanoseconds, truncated to the
// millisecond: charges within one millisecond share a log entry, which bounds
// a model's log to 60 000 entries whatever the load. Waits computed from
// whole-millisecond instants are whole milliseconds, so retry-after-ms stays
// exact.
func (s *Server) now() int64 {
	return s.cfg.Now().UnixNano() / int64(time.Millisecond) * int64(time.Millisecond)
}

// modelList is OpenAI's list of models.
type modelList struct {
	Object string        `json:"object"`
	Data   []modelObject `json:"data"`
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	g := s.gen.Load()
	if _, ok := s.authorize(w, r, g); !ok {
		return
	}
	list := modelList{Object: "list", Data: make([]modelObject, 0, len(s.cfg.Models))}
	for _, m := range s.cfg.Models {
		list.Data = append(list.Data, modelObject{ID: m.Name, Object: "model", Created: g.started.Unix(), OwnedBy: "sluice-sim"})
	}
	s.count(g, nil, http.StatusOK)
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) serveStats(w http.ResponseWriter, r *http.Request) {
	st := s.Stats()
	if v := r.URL.Query().Get("summary"); v != "" && v != "0" && v != "false" {
		st = st.Summary()
	}
	writeJSON(w, http.StatusOK, st)
}
