package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"time"

	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/job"
)

// anthropicBatches is Anthropic's Message Batches API:
// {base}/messages/batches[/{id}[/cancel]], results from the batch's
// results_url, with x-api-key and anthropic-version.
type anthropicBatches struct {
	batchHTTP
	base, apiKey, version string
	lim                   BatchLimits
}

// Batches returns a Message Batches client with a's base URL, key,
// version and transport.
func (a *Anthropic) Batches(lim BatchLimits) BatchClient {
	return &anthropicBatches{batchHTTP: batchHTTP{rt: a.rt, maxResp: a.maxResp}, base: a.baseURL, apiKey: a.apiKey, version: a.version,
		lim: lim.withDefaults(AnthropicBatchMaxRequests, AnthropicBatchMaxBytes)}
}

func (a *anthropicBatches) header() http.Header {
	h := baseHeader(Call{})
	h.Set("X-Api-Key", a.apiKey)
	h.Set("Anthropic-Version", a.version)
	return h
}

// anthropicCustomID is what Anthropic accepts as a custom_id.
var anthropicCustomID = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// Submit converts each line to Messages API params and creates the batch.
// A line that cannot be converted, or whose custom id Anthropic would
// refuse, is a *BatchLineError and nothing is sent.
func (a *anthropicBatches) Submit(ctx context.Context, req BatchRequest) (Batch, error) {
	if req.Endpoint == job.EndpointEmbeddings {
		return Batch{}, buildErr("the Anthropic API has no embeddings endpoint")
	}
	if len(req.Lines) > a.lim.MaxRequests {
		return Batch{}, fmt.Errorf("%w: %d lines, at most %d", ErrBatchTooLarge, len(req.Lines), a.lim.MaxRequests)
	}
	type request struct {
		CustomID string          `json:"custom_id"`
		Params   json.RawMessage `json:"params"`
	}
	reqs := make([]request, 0, len(req.Lines))
	size := int64(0)
	for _, l := range req.Lines {
		if !anthropicCustomID.MatchString(l.CustomID) {
			return Batch{}, &BatchLineError{CustomID: l.CustomID, Err: errors.New("a custom id is 1 to 64 letters, digits, - or _")}
		}
		params, err := wire.ChatToAnthropic(l.Body, req.Model)
		if err != nil {
			return Batch{}, &BatchLineError{CustomID: l.CustomID, Err: err}
		}
		if size += int64(len(params) + len(l.CustomID) + 32); size > a.lim.MaxBytes {
			return Batch{}, fmt.Errorf("%w: more than %d bytes", ErrBatchTooLarge, a.lim.MaxBytes)
		}
		reqs = append(reqs, request{l.CustomID, params})
	}
	body, err := json.Marshal(map[string]any{"requests": reqs})
	if err != nil {
		return Batch{}, buildErr("encoding the batch: %v", err)
	}
	target, err := endpoint(a.base, "/messages/batches")
	if err != nil {
		return Batch{}, buildErr("%v", err)
	}
	resp, err := a.call(ctx, "create", http.MethodPost, target, body, a.header())
	if err != nil {
		var he *BatchHTTPError
		if errors.As(err, &he) {
			he.queueFull = he.Outcome.HTTPStatus == http.StatusTooManyRequests
			he.tooLarge = he.Outcome.HTTPStatus == http.StatusRequestEntityTooLarge
		}
		return Batch{}, err
	}
	return parseAnthropicBatch(resp)
}

// Status reads the batch.
func (a *anthropicBatches) Status(ctx context.Context, id string) (Batch, error) {
	return a.batchCall(ctx, "status", http.MethodGet, "/messages/batches/"+url.PathEscape(id))
}

// Cancel asks for the batch to be cancelled.
func (a *anthropicBatches) Cancel(ctx context.Context, id string) (Batch, error) {
	return a.batchCall(ctx, "cancel", http.MethodPost, "/messages/batches/"+url.PathEscape(id)+"/cancel")
}

func (a *anthropicBatches) batchCall(ctx context.Context, op, method, path string) (Batch, error) {
	target, err := endpoint(a.base, path)
	if err != nil {
		return Batch{}, buildErr("%v", err)
	}
	resp, err := a.call(ctx, op, method, target, nil, a.header())
	if err != nil {
		return Batch{}, err
	}
	return parseAnthropicBatch(resp)
}

func parseAnthropicBatch(body []byte) (Batch, error) {
	var v struct {
		ID               string         `json:"id"`
		ProcessingStatus string         `json:"processing_status"`
		RequestCounts    map[string]int `json:"request_counts"`
		ResultsURL       string         `json:"results_url"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.ID == "" {
		return Batch{}, &TransportError{Phase: PhaseBody, Err: fmt.Errorf("the answer is not a message batch")}
	}
	b := Batch{ID: v.ID, Status: v.ProcessingStatus, resultsURL: v.ResultsURL}
	for k, n := range v.RequestCounts {
		b.Total += n
		if k != "processing" {
			b.Done += n
		}
	}
	switch v.ProcessingStatus {
	case "ended":
		b.State = BatchEnded
	case "canceling":
		b.State = BatchCancelling
	}
	return b, nil
}

// Results reads an ended batch's results from its results_url, which must
// be on the client's own host (the key is sent there).
func (a *anthropicBatches) Results(ctx context.Context, id string) ([]BatchResult, error) {
	b, err := a.Status(ctx, id)
	if err != nil {
		return nil, err
	}
	if b.State != BatchEnded || b.resultsURL == "" {
		return nil, fmt.Errorf("%w: batch %s is %s", ErrBatchNotEnded, id, b.Status)
	}
	base, err1 := url.Parse(a.base)
	res, err2 := url.Parse(b.resultsURL)
	if err1 != nil || err2 != nil || res.Scheme != base.Scheme || res.Host != base.Host {
		return nil, &TransportError{Phase: PhaseBuild, Err: errors.New("results_url is not on the provider's host")}
	}
	now := time.Now()
	var out []BatchResult
	err = a.lines(ctx, "results", b.resultsURL, a.header(), a.lim.MaxLineBytes, func(line []byte) error {
		r, err := parseAnthropicResult(line, now)
		if err == nil {
			out = append(out, r)
		}
		return err
	})
	return out, err
}

// anthropicErrorStatus is the HTTP status Anthropic answers an error type
// with, so an errored line is classified as the synchronous answer would be.
var anthropicErrorStatus = map[string]int{
	"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402, "permission_error": 403,
	"not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500, "overloaded_error": 529,
}

// parseAnthropicResult reads one results line.
func parseAnthropicResult(line []byte, now time.Time) (BatchResult, error) {
	var v struct {
		CustomID string `json:"custom_id"`
		Result   struct {
			Type    string          `json:"type"`
			Message json.RawMessage `json:"message"`
			Error   json.RawMessage `json:"error"`
		} `json:"result"`
	}
	if err := json.Unmarshal(line, &v); err != nil || v.CustomID == "" {
		return BatchResult{}, &TransportError{Phase: PhaseBody, Err: fmt.Errorf("results: a line is not a batch result")}
	}
	r := BatchResult{CustomID: v.CustomID}
	switch v.Result.Type {
	case "succeeded":
		body, u, err := wire.AnthropicToChat(v.Result.Message, now)
		if err != nil {
			return BatchResult{}, &TransportError{Phase: PhaseBody, Err: fmt.Errorf("results: a succeeded line holds no message")}
		}
		r.Result, r.Body, r.Usage, r.Outcome = LineSucceeded, body, u, Outcome{Class: Success, HTTPStatus: http.StatusOK}
	case "errored":
		var e struct {
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
		}
		_ = json.Unmarshal(v.Result.Error, &e)
		status, ok := anthropicErrorStatus[e.Error.Type]
		if !ok {
			status = http.StatusInternalServerError
		}
		r.Result, r.Outcome = LineErrored, lineOutcome(status, v.Result.Error)
		r.Body = v.Result.Error
		if conv, ok := wire.AnthropicErrorToOpenAI(v.Result.Error); ok {
			r.Body = conv
		}
	case "expired":
		r.Result = LineExpired
	case "canceled":
		r.Result = LineCancelled
	default:
		return BatchResult{}, &TransportError{Phase: PhaseBody, Err: fmt.Errorf("results: unknown result type")}
	}
	return r, nil
}
