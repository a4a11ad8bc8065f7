package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Anthropic's Message Batches, as its reference describes them:
//
//	POST /v1/messages/batches                {requests: [{custom_id, params}]}
//	GET  /v1/messages/batches/{id}           processing_status in_progress, canceling or ended; request_counts
//	POST /v1/messages/batches/{id}/cancel    canceling, then ended
//	GET  /v1/messages/batches/{id}/results   JSONL {custom_id, result: {type: succeeded|errored|canceled|expired, message|error}}
//
// with the x-api-key and anthropic-version headers of /v1/messages. A
// batch of more than 100,000 requests (BatchConfig.MaxRequests) is refused
// 400, one larger than 256 MB (BatchConfig.MaxBytes) 413; a duplicate or
// malformed custom_id 400; one whose requests would take the processing
// queue past BatchConfig.QueueRequests 429 rate_limit_error, with
// retry-after when waiting can help. request_counts show every request
// processing until the batch ends, as the reference says; results_url is
// set once it ended. A request's params are checked when it is processed:
// invalid ones, and unknown models, are errored results. Prompt caching is
// not simulated in batches (no cache reads or writes).

// customIDPattern is what Anthropic accepts as a custom_id.
var customIDPattern = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// serveMessageBatches answers /v1/messages/batches[/{id}[/cancel|/results]].
func (s *Server) serveMessageBatches(w http.ResponseWriter, r *http.Request, rest string) {
	if !s.anthropicAuth(w, r) {
		return
	}
	rest = strings.TrimPrefix(rest, "/")
	id, op, _ := strings.Cut(rest, "/")
	method := http.MethodGet
	if id == "" || op == "cancel" {
		method = http.MethodPost
	}
	if r.Method != method {
		w.Header().Set("Allow", method)
		anthropicErr(w, http.StatusMethodNotAllowed, "invalid_request_error", "use "+method)
		return
	}
	if id == "" {
		s.createMessageBatch(w, r)
		return
	}
	st := s.batch.Load()
	st.mu.Lock()
	defer st.mu.Unlock()
	b := st.batches[id]
	if b == nil || b.api != "anthropic" || (op != "" && op != "cancel" && op != "results") {
		anthropicErr(w, http.StatusNotFound, "not_found_error", "message batch not found: "+id)
		return
	}
	now := s.now()
	switch op {
	case "cancel":
		st.cancel(b, now, s.cfg.Batch.Duration)
	case "results":
		st.advance(b, now)
		if b.ended == 0 {
			anthropicErr(w, http.StatusBadRequest, "invalid_request_error", "message batch "+id+" has not ended: its results are not available yet")
			return
		}
		w.Header().Set("Content-Type", "application/binary")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b.anthropicResults())
		return
	}
	st.advance(b, now)
	writeJSON(w, http.StatusOK, b.anthropicObject(resultsURL(r, b.id)))
}

// anthropicAuth checks the key and anthropic-version as /v1/messages does.
func (s *Server) anthropicAuth(w http.ResponseWriter, r *http.Request) bool {
	if len(s.keys) > 0 {
		key := r.Header.Get("X-Api-Key")
		if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && key == "" {
			key = strings.TrimSpace(b)
		}
		if !s.keys[key] {
			anthropicErr(w, http.StatusUnauthorized, "authentication_error", "invalid x-api-key")
			return false
		}
	}
	if r.Header.Get("Anthropic-Version") == "" {
		anthropicErr(w, http.StatusBadRequest, "invalid_request_error", "anthropic-version: header is required")
		return false
	}
	return true
}

func resultsURL(r *http.Request, id string) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host + "/v1/messages/batches/" + id + "/results"
}

// createMessageBatch answers POST /v1/messages/batches.
func (s *Server) createMessageBatch(w http.ResponseWriter, r *http.Request) {
	limit := s.cfg.Batch.maxBytes(AnthropicBatchMaxBytes)
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	switch {
	case err != nil:
		anthropicErr(w, http.StatusBadRequest, "invalid_request_error", "could not read the request body")
		return
	case int64(len(body)) > limit:
		anthropicErr(w, http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("Request exceeds the maximum size of a message batch (%d bytes).", limit))
		return
	}
	var in struct {
		Requests []struct {
			CustomID string          `json:"custom_id"`
			Params   json.RawMessage `json:"params"`
		} `json:"requests"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		anthropicErr(w, http.StatusBadRequest, "invalid_request_error", "malformed body")
		return
	}
	if n, most := len(in.Requests), s.cfg.Batch.maxRequests(AnthropicBatchMaxRequests); n == 0 || n > most {
		anthropicErr(w, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("requests: a message batch holds 1 to %d requests, got %d", most, n))
		return
	}
	now := s.now()
	b := &simBatch{id: "msgbatch_" + randomID(24), api: "anthropic", created: now, expires: now + int64(s.cfg.Batch.Expiry), answer: s.anthropicAnswer}
	seen := map[string]bool{}
	for i, q := range in.Requests {
		if !customIDPattern.MatchString(q.CustomID) || seen[q.CustomID] {
			anthropicErr(w, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("requests[%d].custom_id: must be unique in the batch and match ^[a-zA-Z0-9_-]{1,64}$", i))
			return
		}
		seen[q.CustomID] = true
		b.lines = append(b.lines, &simLine{customID: q.CustomID, body: q.Params})
	}
	schedule(b.lines, now, s.cfg.Batch.Duration)
	st := s.batch.Load()
	st.mu.Lock()
	defer st.mu.Unlock()
	if wait, full := st.queueFull(now, len(b.lines), s.cfg.Batch.QueueRequests); full {
		if wait > 0 {
			w.Header().Set("Retry-After", fmt.Sprint(int64((wait+time.Second-1)/time.Second)))
		}
		anthropicErr(w, http.StatusTooManyRequests, "rate_limit_error", fmt.Sprintf(
			"Number of batch requests in the processing queue would exceed the rate limit of %s for your organization (sim). For details, refer to: https://docs.anthropic.com/en/api/rate-limits.", comma(s.cfg.Batch.QueueRequests)))
		return
	}
	st.batches[b.id] = b
	writeJSON(w, http.StatusOK, b.anthropicObject(resultsURL(r, b.id)))
}

// queueFull reports whether n more requests would take the processing
// queue past limit, and how long until they would fit (0: never, or
// unknown).
func (st *batchState) queueFull(now int64, n, limit int) (time.Duration, bool) {
	if limit <= 0 {
		return 0, false
	}
	var dues []int64
	for _, o := range st.batches {
		if o.api != "anthropic" {
			continue
		}
		st.advance(o, now)
		if o.ended != 0 {
			continue
		}
		for _, l := range o.lines {
			if l.result == "" {
				end := min(l.due, o.expires)
				if o.cancelAt != 0 {
					end = min(end, o.cancelEnd)
				}
				dues = append(dues, end)
			}
		}
	}
	over := len(dues) + n - limit
	if over <= 0 {
		return 0, false
	}
	if n > limit {
		return 0, true
	}
	slices.Sort(dues)
	return time.Duration(max(dues[over-1]-now, int64(time.Millisecond))), true
}

// anthropicAnswer answers a request as /v1/messages would (without its
// rate limits or prompt cache).
func (s *Server) anthropicAnswer(l *simLine, at int64) {
	l.at = at
	errored := func(status int, typ, msg string) {
		l.result, l.status = lineErrored, status
		l.answer = mustJSON(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}, "request_id": "req_" + randomID(24)})
	}
	c, err := parseMessages(l.body, s.cfg.Count)
	switch {
	case err != nil:
		errored(http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	case c.stream:
		errored(http.StatusBadRequest, "invalid_request_error", "stream: streaming is not supported in message batches")
		return
	case s.anth.Load().models[c.model] == nil:
		errored(http.StatusNotFound, "not_found_error", "model: "+c.model)
		return
	}
	out := min(max(s.cfg.OutputTokens(c.maxOut, l.body), 0), c.maxOut)
	l.result, l.status, l.answer = lineSucceeded, http.StatusOK, mustJSON(s.message(c, l.body, out))
}

// anthropicResults is an ended batch's results file.
func (b *simBatch) anthropicResults() []byte {
	var out bytes.Buffer
	for _, l := range b.lines {
		res := map[string]any{"type": l.result}
		switch l.result {
		case lineSucceeded:
			res["message"] = json.RawMessage(l.answer)
		case lineErrored:
			res["error"] = json.RawMessage(l.answer)
		}
		out.Write(mustJSON(map[string]any{"custom_id": l.customID, "result": res}))
		out.WriteByte('\n')
	}
	return out.Bytes()
}

// anthropicObject is b as a message_batch object.
func (b *simBatch) anthropicObject(results string) map[string]any {
	ts := func(t int64) any {
		if t == 0 {
			return nil
		}
		return time.Unix(0, t).UTC().Format(time.RFC3339Nano)
	}
	status := "in_progress"
	switch {
	case b.ended != 0:
		status = "ended"
	case b.cancelAt != 0:
		status = "canceling"
	}
	counts := map[string]int{"processing": len(b.lines), lineSucceeded: 0, lineErrored: 0, lineCanceled: 0, lineExpired: 0}
	if b.ended != 0 {
		counts["processing"] = 0
		for k, v := range b.counts() {
			counts[k] += v
		}
	} else {
		results = ""
	}
	return map[string]any{"id": b.id, "type": "message_batch", "processing_status": status, "request_counts": counts,
		"ended_at": ts(b.ended), "created_at": ts(b.created), "expires_at": ts(b.expires), "archived_at": nil,
		"cancel_initiated_at": ts(b.cancelAt), "results_url": nullable(results)}
}
