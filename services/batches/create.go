package batches

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// Endpoints a batch may name: OpenAI's path -> the job's endpoint.
var endpoints = map[string]string{
	"/v1/chat/completions": "", // chat, as the chat completions endpoint submits it
	"/v1/embeddings":       job.EndpointEmbeddings,
}

func knownEndpoint(e string) bool {
	_, ok := endpoints[e]
	return ok
}

// MaxReportedErrors bounds the validation errors a failed batch lists.
const MaxReportedErrors = 100

// createRequest is POST /v1/batches's body.
type createRequest struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
}

// check refuses a request OpenAI would refuse before making a batch.
func (c *createRequest) check() (param, msg string) {
	switch {
	case c.InputFileID == "":
		return "input_file_id", "is required"
	case !knownEndpoint(c.Endpoint):
		return "endpoint", fmt.Sprintf("must be /v1/chat/completions or /v1/embeddings, not %q", clip.String(c.Endpoint, 64))
	case c.CompletionWindow != "24h":
		return "completion_window", `must be "24h"`
	case len(c.Metadata) > 16:
		return "metadata", "may hold at most 16 pairs"
	}
	for k, v := range c.Metadata {
		if len(k) > 64 || len(v) > 512 {
			return "metadata", "keys are at most 64 characters and values at most 512"
		}
	}
	return "", ""
}

// POST /v1/batches: the input file is read and checked at once; a batch
// with a problem is answered failed, with every problem by line (up to
// MaxReportedErrors); otherwise it is validating until the runner takes
// it.
func (h *handlers) create(w http.ResponseWriter, r *http.Request, tenant string) {
	ctx := r.Context()
	var req createRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		badRequest(w, job.CodeInvalidRequest, "", "the body must be a JSON object")
		return
	}
	if param, msg := req.check(); param != "" {
		badRequest(w, job.CodeInvalidRequest, param, param+" "+msg)
		return
	}
	f, err := h.files.get(ctx, tenant, req.InputFileID)
	if errors.Is(err, job.ErrNotFound) {
		notFound(w, "File", req.InputFileID)
		return
	} else if err != nil {
		h.unavailable(w, "read the input file", err)
		return
	}
	if f.Purpose != PurposeBatch {
		badRequest(w, job.CodeInvalidRequest, "input_file_id", "the file's purpose is not batch")
		return
	}
	if n, err := h.count(ctx, openKey(tenant, "")); err != nil {
		h.unavailable(w, "count the tenant's batches", err)
		return
	} else if max := h.app().Batches.MaxBatchesPerTenant; n >= max {
		api.RetryAfter(w, time.Minute)
		api.ErrorParam(w, http.StatusTooManyRequests, "invalid_request_error", "batch_limit_exceeded", "",
			fmt.Sprintf("the tenant has %d batches not yet ended, its bound (batches.max_batches_per_tenant)", n))
		return
	}
	api.ExtendDeadlines(w, FileTransfer) // validation reads the whole input file
	now := h.now()
	b := &batchRecord{ID: newBatchID(), Tenant: tenant, InputFileID: f.ID, Endpoint: req.Endpoint, CompletionWindow: req.CompletionWindow,
		Metadata: req.Metadata, Status: StatusValidating, CreatedAt: now.Unix(), ExpiresAt: now.Add(Window).Unix()}
	total, problems, err := h.validate(ctx, tenant, f.ID, req.Endpoint)
	if err != nil {
		h.unavailable(w, "read the input file", err)
		return
	}
	b.Total, b.Errors = total, problems
	if len(problems) > 0 {
		b.Status, b.FailedAt = StatusFailed, now.Unix()
	}
	if err := h.record(ctx, b); err != nil {
		h.unavailable(w, "record the batch", err)
		return
	}
	h.wake()
	api.JSON(w, http.StatusOK, b.object())
}

// record writes a new batch, and its open key unless it failed.
func (h *handlers) record(ctx context.Context, b *batchRecord) error {
	kv, _, err := h.stores(ctx)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(b)
	if _, err := kv.Create(ctx, batchKey(b.Tenant, b.ID), data); err != nil {
		return err
	}
	if b.ended() {
		return nil
	}
	_, err = kv.Put(ctx, openKey(b.Tenant, b.ID), nil)
	return err
}

// inputLine is one line of a batch's input file.
type inputLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// validate reads tenant's input file and returns its lines and every
// problem OpenAI would fail the batch for, by line: a line that is not a
// request (invalid_json_line), a custom_id used twice
// (duplicate_custom_id), a url that is not the batch's endpoint
// (url_mismatch), a body Sluice would refuse (its code, param body.*),
// more than MaxLines (too_many_tasks), none (empty_file).
func (h *handlers) validate(ctx context.Context, tenant, fileID, endpoint string) (int, []lineError, error) {
	var problems []lineError
	add := func(e lineError) {
		if len(problems) < MaxReportedErrors {
			problems = append(problems, e)
		}
	}
	seen := map[string]bool{}
	n, err := h.eachLine(ctx, tenant, fileID, func(line int, in *inputLine, perr error) error {
		if perr != nil {
			add(lineError{Code: "invalid_json_line", Message: perr.Error(), Line: line})
			return nil
		}
		switch {
		case seen[in.CustomID]:
			add(lineError{Code: "duplicate_custom_id", Message: fmt.Sprintf("The custom_id %q is used more than once in this batch.", clip.String(in.CustomID, 64)), Param: "custom_id", Line: line})
		case in.URL != endpoint || in.Method != http.MethodPost:
			add(lineError{Code: "url_mismatch", Message: "The line's method and url must be POST and the batch's endpoint " + endpoint + ".", Param: "url", Line: line})
		default:
			if e := h.checkBody(ctx, endpoints[endpoint], in.Body); e != nil {
				e.Line = line
				add(*e)
			}
		}
		seen[in.CustomID] = true
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	switch {
	case n == 0:
		add(lineError{Code: "empty_file", Message: "The input file is empty."})
	case n > MaxLines:
		problems = append([]lineError{{Code: "too_many_tasks", Message: fmt.Sprintf("The batch has %d requests; a batch may have at most %d.", n, MaxLines)}}, problems...)
	}
	return n, problems, nil
}

// checkBody refuses a line's body that ingest would refuse for itself: not
// a request of the endpoint, or a model that is not configured or that
// the caller's key may not call.
func (h *handlers) checkBody(ctx context.Context, endpoint string, body []byte) *lineError {
	app := h.app()
	lim := job.Limits{MaxBodyBytes: app.Limits.MaxBodyBytes, MaxTokens: app.Limits.MaxTokens}
	model, _, err := tokens.Estimate(endpoint, body, lim, app.Limits.DefaultMaxTokens)
	var ve *job.ValidationError
	if errors.As(err, &ve) {
		return &lineError{Code: ve.Code, Message: ve.Message, Param: "body." + api.Param(ve.Field)}
	}
	if err != nil {
		return &lineError{Code: job.CodeInvalidRequest, Message: "the body is not a valid request", Param: "body"}
	}
	if _, _, ok := app.ModelRef(model); !ok || !api.ModelAllowed(ctx, model) {
		return &lineError{Code: job.CodeUnknownModel, Message: fmt.Sprintf("The model %q does not exist or you do not have access to it.", clip.String(model, 64)), Param: "body.model"}
	}
	return nil
}

// eachLine calls fn with each non-blank line of tenant's file, numbered
// from 1, decoded (or the reason it is not a request), and returns how
// many there were. It stops at fn's error, or past MaxLines+1 lines.
func (h *handlers) eachLine(ctx context.Context, tenant, fileID string, fn func(line int, in *inputLine, perr error) error) (int, error) {
	return readLines(ctx, h.files, tenant, fileID, h.app().Limits.MaxBodyBytes, fn)
}

// readLines is eachLine for any owner of the files.
func readLines(ctx context.Context, f *files, tenant, fileID string, maxLine int, fn func(line int, in *inputLine, perr error) error) (int, error) {
	body, err := f.open(ctx, tenant, fileID)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine+1024)
	n, line := 0, 0
	for sc.Scan() {
		line++
		raw := sc.Bytes()
		if len(trimSpace(raw)) == 0 {
			continue
		}
		n++
		if n > MaxLines {
			return n, nil
		}
		var in inputLine
		var perr error
		if json.Unmarshal(raw, &in) != nil || in.CustomID == "" || len(in.Body) == 0 || in.Body[0] != '{' {
			perr = errors.New("This line is not parseable as valid JSON, or lacks custom_id or body.")
		}
		if err := fn(line, &in, perr); err != nil {
			return n, err
		}
	}
	if errors.Is(sc.Err(), bufio.ErrTooLong) {
		return n, fn(line+1, nil, fmt.Errorf("This line is over the %d-byte limit (limits.max_body_bytes).", maxLine))
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return n, err
	}
	return n, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
