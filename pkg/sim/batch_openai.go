package sim

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// OpenAI's Batch API, as its reference describes it:
//
//	POST /v1/files                  multipart: purpose=batch, file=JSONL ({custom_id, method, url, body} a line)
//	GET  /v1/files/{id}[/content]   the file object, or its bytes
//	POST /v1/batches                {input_file_id, endpoint, completion_window: "24h", metadata}
//	GET  /v1/batches                every batch, newest first, on one page (has_more false)
//	GET  /v1/batches/{id}           the batch: status, request_counts, output_file_id, error_file_id
//	POST /v1/batches/{id}/cancel    cancelling, then cancelled
//
// A batch is created validating. Its input is checked as OpenAI checks it,
// and a problem fails the whole batch (status failed, errors.data[] with
// code and line): empty_file, invalid_json_line, duplicate_custom_id,
// url_mismatch (a line's url is not the batch's endpoint), model_mismatch
// (one model per batch), too_many_tasks (more than 50,000 lines, or
// BatchConfig.MaxRequests), token_limit_exceeded (the model's enqueued
// tokens would pass BatchConfig.EnqueuedTokens). An input file larger than
// 200 MB (BatchConfig.MaxBytes) is refused when it is uploaded. Otherwise
// the batch is in_progress, finalizing for a tenth of its duration once
// every line is answered, then completed; or cancelling, then cancelled;
// or expired. When it ends, the output file holds the 2xx answers and the
// error file the others, each line {id, custom_id, response: {status_code,
// request_id, body}, error}; an expired line has error code batch_expired
// and a cancelled one batch_cancelled.
//
// Under ProfileAzure the same API is also served at Azure's paths,
// /openai/files and /openai/batches (api-version required, the key in
// api-key), with endpoints and line urls without /v1 ("/chat/completions")
// and each line's model naming the deployment.

// serveBatch answers the Batch APIs' paths; it reports false for others.
func (s *Server) serveBatch(w http.ResponseWriter, r *http.Request) bool {
	p := r.URL.Path
	switch {
	case p == "/v1/messages/batches" || strings.HasPrefix(p, "/v1/messages/batches/"):
		s.serveMessageBatches(w, r, strings.TrimPrefix(p, "/v1/messages/batches"))
	case p == "/v1/files" || strings.HasPrefix(p, "/v1/files/"):
		s.serveFiles(w, r, strings.TrimPrefix(p, "/v1/files"), false)
	case p == "/v1/batches" || strings.HasPrefix(p, "/v1/batches/"):
		s.serveBatches(w, r, strings.TrimPrefix(p, "/v1/batches"), false)
	case s.cfg.Profile != ProfileAzure:
		return false
	case p == "/openai/files" || strings.HasPrefix(p, "/openai/files/"):
		s.serveFiles(w, r, strings.TrimPrefix(p, "/openai/files"), true)
	case p == "/openai/batches" || strings.HasPrefix(p, "/openai/batches/"):
		s.serveBatches(w, r, strings.TrimPrefix(p, "/openai/batches"), true)
	default:
		return false
	}
	return true
}

// batchAuth checks the caller's key: Azure's api-key (and api-version) on
// Azure's paths, a Bearer key on OpenAI's.
func (s *Server) batchAuth(w http.ResponseWriter, r *http.Request, azure bool) bool {
	g := s.gen.Load()
	if !azure {
		_, ok := s.authorize(w, r, g)
		return ok
	}
	if r.URL.Query().Get("api-version") == "" {
		s.azureNotFound(w)
		return false
	}
	_, ok := s.authorizeAzure(w, g, r)
	return ok
}

func (s *Server) batchFail(w http.ResponseWriter, status int, e apiError) {
	s.fail(w, s.gen.Load(), nil, status, e)
}

// serveFiles answers /v1/files[/{id}[/content]].
func (s *Server) serveFiles(w http.ResponseWriter, r *http.Request, rest string, azure bool) {
	if !s.batchAuth(w, r, azure) {
		return
	}
	id, content := strings.CutSuffix(strings.TrimPrefix(rest, "/"), "/content")
	switch {
	case id == "" && !content:
		if s.allow(w, r, http.MethodPost) {
			s.uploadFile(w, r)
		}
	case strings.Contains(id, "/") || id == "":
		s.unknownURL(w, r)
	case s.allow(w, r, http.MethodGet):
		st := s.batch.Load()
		st.mu.Lock()
		f := st.files[id]
		st.mu.Unlock()
		switch {
		case f == nil:
			s.batchFail(w, http.StatusNotFound, apiError{Message: "No such File object: " + id, Type: "invalid_request_error", Param: "id"})
		case content:
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(f.data)
		default:
			writeJSON(w, http.StatusOK, f.object())
		}
	}
}

func (f *simFile) object() map[string]any {
	return map[string]any{"id": f.id, "object": "file", "bytes": len(f.data), "created_at": f.created / int64(time.Second),
		"filename": f.name, "purpose": f.purpose, "status": "processed", "status_details": nil}
}

// uploadFile stores a multipart upload (fields purpose and file).
func (s *Server) uploadFile(w http.ResponseWriter, r *http.Request) {
	limit := s.cfg.Batch.maxBytes(OpenAIBatchMaxBytes)
	mr, err := r.MultipartReader()
	if err != nil {
		s.batchFail(w, http.StatusBadRequest, apiError{Message: "The request must be multipart/form-data with fields purpose and file.", Type: "invalid_request_error"})
		return
	}
	f := &simFile{}
	var got bool
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			s.batchFail(w, http.StatusBadRequest, apiError{Message: "Could not read the multipart body.", Type: "invalid_request_error"})
			return
		}
		data, err := io.ReadAll(io.LimitReader(part, limit+1))
		if err != nil {
			s.batchFail(w, http.StatusBadRequest, apiError{Message: "Could not read the multipart body.", Type: "invalid_request_error"})
			return
		}
		switch part.FormName() {
		case "purpose":
			f.purpose = string(data)
		case "file":
			if int64(len(data)) > limit {
				s.batchFail(w, http.StatusBadRequest, apiError{Type: "invalid_request_error", Param: "file", Code: "file_too_large",
					Message: fmt.Sprintf("File is larger than %d bytes, the limit of a batch input file.", limit)})
				return
			}
			f.data, f.name, got = data, part.FileName(), true
		}
	}
	switch {
	case !got:
		s.batchFail(w, http.StatusBadRequest, apiError{Message: "Missing required parameter: 'file'.", Type: "invalid_request_error", Param: "file"})
		return
	case f.purpose == "":
		s.batchFail(w, http.StatusBadRequest, apiError{Message: "Missing required parameter: 'purpose'.", Type: "invalid_request_error", Param: "purpose"})
		return
	}
	f.id, f.created = "file-"+randomID(24), s.now()
	st := s.batch.Load()
	st.mu.Lock()
	st.files[f.id] = f
	st.mu.Unlock()
	writeJSON(w, http.StatusOK, f.object())
}

// serveBatches answers /v1/batches[/{id}[/cancel]].
func (s *Server) serveBatches(w http.ResponseWriter, r *http.Request, rest string, azure bool) {
	if !s.batchAuth(w, r, azure) {
		return
	}
	id, cancel := strings.CutSuffix(strings.TrimPrefix(rest, "/"), "/cancel")
	switch {
	case id == "" && !cancel && r.Method == http.MethodGet:
		s.listBatches(w)
		return
	case id == "" && !cancel:
		if s.allow(w, r, http.MethodPost) {
			s.createBatch(w, r, azure)
		}
		return
	case id == "" || strings.Contains(id, "/"):
		s.unknownURL(w, r)
		return
	}
	method := http.MethodGet
	if cancel {
		method = http.MethodPost
	}
	if !s.allow(w, r, method) {
		return
	}
	st := s.batch.Load()
	st.mu.Lock()
	defer st.mu.Unlock()
	b := st.batches[id]
	if b == nil || b.api != "openai" {
		s.batchFail(w, http.StatusNotFound, apiError{Message: "No batch found with id '" + id + "'.", Type: "invalid_request_error", Param: "batch_id"})
		return
	}
	now := s.now()
	st.advance(b, now)
	if cancel {
		if b.failure != nil || b.ended != 0 {
			s.batchFail(w, http.StatusConflict, apiError{Message: "Cannot cancel a batch with status " + b.openAIStatus() + ".", Type: "invalid_request_error"})
			return
		}
		st.cancel(b, now, s.cfg.Batch.Duration)
	}
	writeJSON(w, http.StatusOK, b.openAIObject(false))
}

// openAIEndpoints are the endpoints a batch may name.
var openAIEndpoints = []string{"/v1/chat/completions", "/v1/embeddings", "/v1/responses"}

// createBatch answers POST /v1/batches.
func (s *Server) createBatch(w http.ResponseWriter, r *http.Request, azure bool) {
	var in struct {
		InputFileID      string `json:"input_file_id"`
		Endpoint         string `json:"endpoint"`
		CompletionWindow string `json:"completion_window"`
		Metadata         any    `json:"metadata"`
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err != nil {
		s.batchFail(w, http.StatusBadRequest, apiError{Message: "We could not parse the JSON body of your request.", Type: "invalid_request_error"})
		return
	}
	endpoint := in.Endpoint
	if azure && !strings.HasPrefix(endpoint, "/v1/") {
		endpoint = "/v1" + endpoint
	}
	switch {
	case in.CompletionWindow != "24h":
		s.batchFail(w, http.StatusBadRequest, apiError{Message: "Invalid value for 'completion_window': only '24h' is supported.", Type: "invalid_request_error", Param: "completion_window"})
		return
	case !contains(openAIEndpoints, endpoint):
		s.batchFail(w, http.StatusBadRequest, apiError{Message: fmt.Sprintf("Invalid value for 'endpoint': %q is not supported.", in.Endpoint), Type: "invalid_request_error", Param: "endpoint"})
		return
	}
	st := s.batch.Load()
	st.mu.Lock()
	defer st.mu.Unlock()
	f := st.files[in.InputFileID]
	if f == nil || f.purpose != "batch" {
		s.batchFail(w, http.StatusBadRequest, apiError{Message: fmt.Sprintf("Invalid 'input_file_id': %q is not a file uploaded with purpose 'batch'.", in.InputFileID), Type: "invalid_request_error", Param: "input_file_id"})
		return
	}
	now := s.now()
	b := &simBatch{id: "batch_" + randomID(24), api: "openai", endpoint: in.Endpoint, created: now, expires: now + int64(s.cfg.Batch.Expiry),
		finalize: int64(s.cfg.Batch.Duration) / 10, inputFile: f.id, metadata: in.Metadata}
	b.failure = s.readBatchInput(b, f.data, endpoint, azure)
	schedule(b.lines, now, s.cfg.Batch.Duration)
	if b.failure == nil {
		b.failure = st.enqueue(b, now, s.cfg.Batch.EnqueuedTokens, s.batchAnswerer(endpoint))
	}
	b.answer = s.openAIAnswer(endpoint)
	b.onEnd = func(b *simBatch) { st.writeOutputs(b) }
	st.batches[b.id] = b
	writeJSON(w, http.StatusOK, b.openAIObject(true))
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// readBatchInput reads a batch's JSONL into b.lines, its model and its
// prompt tokens, or returns the first problem OpenAI would fail it for.
func (s *Server) readBatchInput(b *simBatch, data []byte, endpoint string, azure bool) *batchFailure {
	fail := func(code, msg string, line int) *batchFailure {
		f := &batchFailure{Code: code, Message: msg}
		if line > 0 {
			f.Line = &line
		}
		return f
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), len(data)+1)
	n := 0
	for sc.Scan() {
		n++
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		var in struct {
			CustomID string          `json:"custom_id"`
			Method   string          `json:"method"`
			URL      string          `json:"url"`
			Body     json.RawMessage `json:"body"`
		}
		if json.Unmarshal(raw, &in) != nil || in.CustomID == "" || len(in.Body) == 0 {
			return fail("invalid_json_line", "This line is not parseable as valid JSON, or lacks custom_id or body.", n)
		}
		url := in.URL
		if azure && !strings.HasPrefix(url, "/v1/") {
			url = "/v1" + url
		}
		model := modelOf(in.Body)
		switch {
		case seen[in.CustomID]:
			return fail("duplicate_custom_id", fmt.Sprintf("The custom_id %q is used more than once in this batch.", in.CustomID), n)
		case url != endpoint || in.Method != http.MethodPost:
			return fail("url_mismatch", "The line's method and url must be POST and the batch's endpoint "+endpoint+".", n)
		case b.model != "" && model != b.model:
			return fail("model_mismatch", "Every request in a batch must use the same model.", n)
		}
		seen[in.CustomID], b.model = true, model
		b.lines = append(b.lines, &simLine{customID: in.CustomID, body: in.Body})
	}
	switch limit := s.cfg.Batch.maxRequests(OpenAIBatchMaxRequests); {
	case len(b.lines) == 0:
		return fail("empty_file", "The input file is empty.", 0)
	case len(b.lines) > limit:
		return fail("too_many_tasks", fmt.Sprintf("The batch has %d requests; a batch may have at most %d.", len(b.lines), limit), 0)
	}
	return nil
}

// batchAnswerer parses a line's body as endpoint's synchronous call.
func (s *Server) batchAnswerer(endpoint string) func([]byte) (*call, error) {
	switch endpoint {
	case "/v1/embeddings":
		return s.parseEmbeddings
	case "/v1/responses":
		return s.parseResponses
	}
	return s.parseChat
}

// enqueue checks b against its model's enqueued-token limit, counting the
// prompt tokens of the model's batches not yet ended.
func (st *batchState) enqueue(b *simBatch, now, limit int64, parse func([]byte) (*call, error)) *batchFailure {
	for _, l := range b.lines {
		if c, err := parse(l.body); err == nil {
			b.tokens += int64(c.prompt)
		}
	}
	if limit <= 0 {
		return nil
	}
	var used int64
	for _, o := range st.batches {
		if o.api == "openai" && o.model == b.model && o.failure == nil {
			st.advance(o, now)
			if o.ended == 0 {
				used += o.tokens
			}
		}
	}
	if used+b.tokens <= limit {
		return nil
	}
	return &batchFailure{Code: "token_limit_exceeded", Message: fmt.Sprintf(
		"Enqueued token limit reached for %s in organization %s. Limit: %s enqueued tokens. Please try again once some in_progress batches have been completed.",
		b.model, organization, comma(int(limit)))}
}

// openAIAnswer answers a line as the synchronous endpoint would.
func (s *Server) openAIAnswer(endpoint string) func(l *simLine, at int64) {
	parse := s.batchAnswerer(endpoint)
	return func(l *simLine, at int64) {
		l.at = at
		c, err := parse(l.body)
		if err != nil {
			l.result, l.status, l.answer = lineErrored, http.StatusBadRequest, mustJSON(invalidRequest(err))
			return
		}
		c.body = l.body
		if s.gen.Load().models[c.model] == nil {
			l.result, l.status = lineErrored, http.StatusNotFound
			l.answer = mustJSON(apiError{Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", c.model), Type: "invalid_request_error", Code: "model_not_found"})
			return
		}
		var resp any
		completion := 0
		switch {
		case c.embed != nil:
			resp = newEmbeddings(c)
		case c.responses:
			completion = min(max(s.cfg.OutputTokens(c.maxOut, c.body), 0), c.maxOut)
			resp = s.newResponse(c, completion)
		default:
			completion = min(max(s.cfg.OutputTokens(c.maxOut, c.body), 0), c.maxOut)
			resp = s.newCompletion(c, completion, time.Unix(0, at))
		}
		l.result, l.status, l.answer = lineSucceeded, http.StatusOK, mustJSON(resp)
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil { // only our own types are encoded
		panic(fmt.Sprintf("sim: encoding: %v", err))
	}
	return b
}

// writeOutputs writes an ended OpenAI batch's output and error files.
func (st *batchState) writeOutputs(b *simBatch) {
	var out, errs bytes.Buffer
	for _, l := range b.lines {
		line := map[string]any{"id": "batch_req_" + randomID(24), "custom_id": l.customID, "response": nil, "error": nil}
		switch l.result {
		case lineSucceeded, lineErrored:
			line["response"] = map[string]any{"status_code": l.status, "request_id": "req_" + randomID(24), "body": json.RawMessage(l.answer)}
		case lineExpired:
			line["error"] = map[string]any{"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}
		default:
			line["error"] = map[string]any{"code": "batch_cancelled", "message": "This request was not executed because the batch was cancelled."}
		}
		dst := &errs
		if l.result == lineSucceeded {
			dst = &out
		}
		dst.Write(mustJSON(line))
		dst.WriteByte('\n')
	}
	file := func(data []byte, name string) string {
		if len(data) == 0 {
			return ""
		}
		f := &simFile{id: "file-" + randomID(24), name: b.id + "_" + name + ".jsonl", purpose: "batch_output", created: b.ended, data: data}
		st.files[f.id] = f
		return f.id
	}
	b.outputFile, b.errorFile = file(out.Bytes(), "output"), file(errs.Bytes(), "error")
}

// openAIStatus is b.s status (once advanced).
func (b *simBatch) openAIStatus() string {
	switch {
	case b.failure != nil:
		return "failed"
	case b.ended != 0 && b.cancelAt != 0:
		return "cancelled"
	case b.ended != 0 && b.endedAs == lineExpired:
		return "expired"
	case b.ended != 0:
		return "completed"
	case b.cancelAt != 0:
		return "cancelling"
	case b.counts()[""] == 0:
		return "finalizing"
	}
	return "in_progress"
}

// openAIObject is b as OpenAI's batch object; created: the answer to its
// creation, still validating.
func (b *simBatch) openAIObject(created bool) map[string]any {
	sec := func(t int64) any {
		if t == 0 {
			return nil
		}
		return t / int64(time.Second)
	}
	status := b.openAIStatus()
	c := b.counts()
	o := map[string]any{"id": b.id, "object": "batch", "endpoint": b.endpoint, "model": nullable(b.model), "errors": nil,
		"input_file_id": b.inputFile, "completion_window": "24h", "status": status,
		"output_file_id": nullable(b.outputFile), "error_file_id": nullable(b.errorFile),
		"created_at": sec(b.created), "in_progress_at": nil, "expires_at": sec(b.expires), "finalizing_at": nil,
		"completed_at": nil, "failed_at": nil, "expired_at": nil, "cancelling_at": sec(b.cancelAt), "cancelled_at": nil,
		"request_counts": map[string]int{"total": len(b.lines), "completed": c[lineSucceeded], "failed": c[lineErrored] + c[lineExpired]},
		"metadata":       b.metadata}
	switch {
	case created:
		o["status"], o["request_counts"] = "validating", map[string]int{"total": 0, "completed": 0, "failed": 0}
		o["cancelling_at"] = nil
		return o
	case status == "failed":
		o["failed_at"], o["request_counts"] = sec(b.created), map[string]int{"total": 0, "completed": 0, "failed": 0}
		o["errors"] = map[string]any{"object": "list", "data": []*batchFailure{b.failure}}
		return o
	}
	o["in_progress_at"] = sec(b.created)
	switch status {
	case "cancelled":
		o["cancelled_at"] = sec(b.ended)
	case "expired":
		o["expired_at"] = sec(b.ended)
	case "completed":
		o["completed_at"], o["finalizing_at"] = sec(b.ended), sec(b.ended-b.finalize)
	case "finalizing":
		last := b.created
		for _, l := range b.lines {
			last = max(last, l.at)
		}
		o["finalizing_at"] = sec(last)
	}
	return o
}

// modelOf reads a request body's model.
func modelOf(body []byte) string {
	var v struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &v)
	return v.Model
}

// usageOf reads the billed tokens of a succeeded line's answer.
func usageOf(api string, answer []byte) (in, out int) {
	var v struct {
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			InputTokens      int `json:"input_tokens"`
			OutputTokens     int `json:"output_tokens"`
			CacheWrite       int `json:"cache_creation_input_tokens"`
			CacheRead        int `json:"cache_read_input_tokens"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(answer, &v)
	u := v.Usage
	if api == "anthropic" {
		return u.InputTokens + u.CacheWrite + u.CacheRead, u.OutputTokens
	}
	return u.PromptTokens + u.InputTokens, u.CompletionTokens + u.OutputTokens
}

// listBatches answers GET /v1/batches: the OpenAI batches, newest first
// (no paging: every batch on one page, has_more false).
func (s *Server) listBatches(w http.ResponseWriter) {
	st := s.batch.Load()
	st.mu.Lock()
	defer st.mu.Unlock()
	now := s.now()
	var list []*simBatch
	for _, b := range st.batches {
		if b.api == "openai" {
			st.advance(b, now)
			list = append(list, b)
		}
	}
	slices.SortFunc(list, func(a, b *simBatch) int { return cmp.Compare(b.created, a.created) })
	data := make([]map[string]any, 0, len(list))
	for _, b := range list {
		data = append(data, b.openAIObject(false))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data, "has_more": false})
}
