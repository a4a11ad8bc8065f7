package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"

	"github.com/sluice-dev/sluice/pkg/job"
)

// openAIBatches is OpenAI's Batch API, and Azure's, which differs only in
// where it is served and what the lines name:
//
//	OpenAI: {base}/files, {base}/batches[/{id}[/cancel]], {base}/files/{id}/content,
//	        Authorization: Bearer; endpoint and line url "/v1/chat/completions";
//	        each line's body as given.
//	Azure:  {resource}/openai/files, /openai/batches[...] ?api-version=V, api-key;
//	        endpoint and line url "/chat/completions"; each line's model set to
//	        the (global-batch) deployment.
type openAIBatches struct {
	batchHTTP
	base   string // ending before /files, /batches
	query  string // "" or "?api-version=V"
	header func() http.Header
	azure  bool
	lim    BatchLimits
}

// Batches returns a batch client with o's base URL, key and transport.
func (o *OpenAI) Batches(lim BatchLimits) BatchClient {
	return &openAIBatches{batchHTTP: batchHTTP{rt: o.rt, maxResp: o.maxResp}, base: o.baseURL,
		header: func() http.Header {
			h := baseHeader(Call{})
			if o.apiKey != "" {
				h.Set("Authorization", "Bearer "+o.apiKey)
			}
			return h
		}, lim: lim.withDefaults(OpenAIBatchMaxRequests, OpenAIBatchMaxBytes)}
}

// Batches returns a batch client for a's resource: Azure's global batch.
func (a *Azure) Batches(lim BatchLimits) BatchClient {
	return &openAIBatches{batchHTTP: batchHTTP{rt: a.rt, maxResp: a.maxResp}, base: strings.TrimRight(a.baseURL, "/") + "/openai",
		query: "?api-version=" + url.QueryEscape(a.version), azure: true,
		header: func() http.Header { return a.header(Call{}) },
		lim:    lim.withDefaults(OpenAIBatchMaxRequests, OpenAIBatchMaxBytes)}
}

func (o *openAIBatches) url(path string) (string, error) {
	u, err := endpoint(o.base, path)
	if err != nil {
		return "", buildErr("%v", err)
	}
	return u + o.query, nil
}

// endpointPath is the batch's endpoint as the provider names it.
func (o *openAIBatches) endpointPath(endpoint string) string {
	p := "/v1/chat/completions"
	if endpoint == job.EndpointEmbeddings {
		p = "/v1/embeddings"
	}
	if o.azure {
		p = strings.TrimPrefix(p, "/v1")
	}
	return p
}

// Submit uploads the lines as a JSONL file (purpose batch) and creates a
// batch of it with a 24 h completion window.
func (o *openAIBatches) Submit(ctx context.Context, req BatchRequest) (Batch, error) {
	if len(req.Lines) > o.lim.MaxRequests {
		return Batch{}, fmt.Errorf("%w: %d lines, at most %d", ErrBatchTooLarge, len(req.Lines), o.lim.MaxRequests)
	}
	ep := o.endpointPath(req.Endpoint)
	var file bytes.Buffer
	for _, l := range req.Lines {
		body := l.Body
		if o.azure && req.Model != "" {
			name, _ := json.Marshal(req.Model)
			body = job.WithMember(body, "model", name)
		}
		line, err := json.Marshal(struct {
			CustomID string          `json:"custom_id"`
			Method   string          `json:"method"`
			URL      string          `json:"url"`
			Body     json.RawMessage `json:"body"`
		}{l.CustomID, http.MethodPost, ep, body})
		if err != nil {
			return Batch{}, &BatchLineError{CustomID: l.CustomID, Err: errMalformedBody}
		}
		file.Write(line)
		file.WriteByte('\n')
		if int64(file.Len()) > o.lim.MaxBytes {
			return Batch{}, fmt.Errorf("%w: more than %d bytes", ErrBatchTooLarge, o.lim.MaxBytes)
		}
	}
	fileID, err := o.upload(ctx, file.Bytes())
	if err != nil {
		return Batch{}, err
	}
	target, err := o.url("/batches")
	if err != nil {
		return Batch{}, err
	}
	create := map[string]any{"input_file_id": fileID, "endpoint": ep, "completion_window": "24h"}
	if req.Key != "" {
		create["metadata"] = map[string]string{MetadataKey: req.Key}
	}
	body, _ := json.Marshal(create)
	resp, err := o.call(ctx, "create", http.MethodPost, target, body, o.header())
	if err != nil {
		return Batch{}, err
	}
	return parseOpenAIBatch(resp)
}

// errMalformedBody names a line body that is not JSON, without quoting it.
var errMalformedBody = errors.New("the body is not valid JSON")

// upload POSTs data as a multipart file with purpose batch.
func (o *openAIBatches) upload(ctx context.Context, data []byte) (string, error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="file"; filename="batch.jsonl"`)
	h.Set("Content-Type", "application/jsonl")
	part, _ := mw.CreatePart(h)
	_, _ = part.Write(data)
	_ = mw.Close()
	target, err := o.url("/files")
	if err != nil {
		return "", err
	}
	hdr := o.header()
	hdr.Set("Content-Type", mw.FormDataContentType())
	resp, err := o.call(ctx, "upload", http.MethodPost, target, body.Bytes(), hdr)
	if err != nil {
		var he *BatchHTTPError
		if errors.As(err, &he) && he.Outcome.Code == "file_too_large" {
			he.tooLarge = true
		}
		return "", err
	}
	var f struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(resp, &f) != nil || f.ID == "" {
		return "", &TransportError{Phase: PhaseBody, Err: fmt.Errorf("upload: no file id in the answer")}
	}
	return f.ID, nil
}

// Status reads the batch.
func (o *openAIBatches) Status(ctx context.Context, id string) (Batch, error) {
	return o.batchCall(ctx, "status", http.MethodGet, "/batches/"+url.PathEscape(id))
}

// Cancel asks for the batch to be cancelled.
func (o *openAIBatches) Cancel(ctx context.Context, id string) (Batch, error) {
	return o.batchCall(ctx, "cancel", http.MethodPost, "/batches/"+url.PathEscape(id)+"/cancel")
}

func (o *openAIBatches) batchCall(ctx context.Context, op, method, path string) (Batch, error) {
	target, err := o.url(path)
	if err != nil {
		return Batch{}, err
	}
	resp, err := o.call(ctx, op, method, target, nil, o.header())
	if err != nil {
		return Batch{}, err
	}
	return parseOpenAIBatch(resp)
}

// Find lists the newest 100 batches and returns the one whose metadata
// holds key.
func (o *openAIBatches) Find(ctx context.Context, key string) (Batch, bool, error) {
	target, err := o.url("/batches")
	if err != nil {
		return Batch{}, false, err
	}
	if o.query == "" {
		target += "?limit=100"
	} else {
		target += "&limit=100"
	}
	resp, err := o.call(ctx, "list", http.MethodGet, target, nil, o.header())
	if err != nil {
		return Batch{}, false, err
	}
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(resp, &list); err != nil {
		return Batch{}, false, &TransportError{Phase: PhaseBody, Err: fmt.Errorf("list: the answer is not a list of batches")}
	}
	for _, raw := range list.Data {
		var m struct {
			Metadata map[string]string `json:"metadata"`
		}
		if json.Unmarshal(raw, &m) == nil && m.Metadata[MetadataKey] == key {
			b, err := parseOpenAIBatch(raw)
			return b, err == nil, err
		}
	}
	return Batch{}, false, nil
}

// openAIBatch is the part of OpenAI's batch object Sluice reads.
type openAIBatch struct {
	ID            string `json:"id"`
	Status        string `json:"status"`
	OutputFileID  string `json:"output_file_id"`
	ErrorFileID   string `json:"error_file_id"`
	RequestCounts struct {
		Total, Completed, Failed int
	} `json:"request_counts"`
	Errors *struct {
		Data []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Line    *int   `json:"line"`
		} `json:"data"`
	} `json:"errors"`
}

func parseOpenAIBatch(body []byte) (Batch, error) {
	var v openAIBatch
	if err := json.Unmarshal(body, &v); err != nil || v.ID == "" {
		return Batch{}, &TransportError{Phase: PhaseBody, Err: fmt.Errorf("the answer is not a batch object")}
	}
	b := Batch{ID: v.ID, Status: v.Status, Total: v.RequestCounts.Total, Done: v.RequestCounts.Completed + v.RequestCounts.Failed,
		outputFile: v.OutputFileID, errorFile: v.ErrorFileID}
	switch v.Status {
	case "completed", "expired", "cancelled":
		b.State = BatchEnded
	case "cancelling":
		b.State = BatchCancelling
	case "failed":
		b.State = BatchFailed
		e := &BatchError{Code: "failed", Message: "the provider failed the batch"}
		if v.Errors != nil && len(v.Errors.Data) > 0 {
			d := v.Errors.Data[0]
			e = &BatchError{Code: d.Code, Message: cleanMessage(d.Message)}
			if d.Line != nil {
				e.Line = *d.Line
			}
		}
		b.Err = e
	}
	return b, nil
}

// Results reads an ended batch's output and error files.
func (o *openAIBatches) Results(ctx context.Context, id string) ([]BatchResult, error) {
	b, err := o.Status(ctx, id)
	if err != nil {
		return nil, err
	}
	if b.State != BatchEnded {
		return nil, fmt.Errorf("%w: batch %s is %s", ErrBatchNotEnded, id, b.Status)
	}
	var out []BatchResult
	for _, f := range []string{b.outputFile, b.errorFile} {
		if f == "" {
			continue
		}
		target, err := o.url("/files/" + url.PathEscape(f) + "/content")
		if err != nil {
			return nil, err
		}
		err = o.lines(ctx, "results", target, o.header(), o.lim.MaxLineBytes, func(line []byte) error {
			r, err := parseOpenAIResult(line)
			if err == nil {
				out = append(out, r)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// parseOpenAIResult reads one output or error file line.
func parseOpenAIResult(line []byte) (BatchResult, error) {
	var v struct {
		CustomID string `json:"custom_id"`
		Response *struct {
			StatusCode int             `json:"status_code"`
			Body       json.RawMessage `json:"body"`
		} `json:"response"`
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(line, &v); err != nil || v.CustomID == "" {
		return BatchResult{}, &TransportError{Phase: PhaseBody, Err: fmt.Errorf("results: a line is not a batch result")}
	}
	r := BatchResult{CustomID: v.CustomID}
	switch {
	case v.Response != nil && v.Response.StatusCode >= 200 && v.Response.StatusCode <= 299:
		r.Result, r.Body, r.Usage = LineSucceeded, v.Response.Body, ParseUsage(v.Response.Body)
		r.Outcome = Outcome{Class: Success, HTTPStatus: v.Response.StatusCode}
	case v.Response != nil:
		r.Result, r.Body = LineErrored, v.Response.Body
		r.Outcome = lineOutcome(v.Response.StatusCode, v.Response.Body)
	case v.Error != nil && v.Error.Code == "batch_expired":
		r.Result = LineExpired
	case v.Error != nil && (v.Error.Code == "batch_cancelled" || v.Error.Code == "batch_canceled"):
		r.Result = LineCancelled
	default:
		// A line error without an HTTP answer (not one of the two above):
		// classified by its code as a body-less error would be.
		r.Result = LineErrored
		if v.Error != nil {
			r.Body, _ = json.Marshal(map[string]any{"error": map[string]any{"code": v.Error.Code, "message": v.Error.Message, "type": nil, "param": nil}})
		}
		r.Outcome = lineOutcome(http.StatusInternalServerError, r.Body)
	}
	return r, nil
}
