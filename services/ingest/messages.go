package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// The anthropic-version header is required on /v1/messages, as Anthropic
// requires it, and must be a date (YYYY-MM-DD, as Anthropic's versions are;
// SDKs send the version they were built against, which moves). It does not
// change what Sluice sends upstream: an Anthropic provider is called with
// its own configured version, and the request and response shapes Sluice
// translates are those of 2023-06-01, which later versions extend.
func validAnthropicVersion(v string) bool {
	_, err := time.Parse(time.DateOnly, v)
	return err == nil
}

// POST /v1/messages: Anthropic's Messages API, through the same mesh as
// chat completions. The request is translated to an OpenAI chat body (so
// it is validated, estimated, queued, admitted and called as any chat job,
// on any configured provider: an Anthropic provider gets it translated back
// by the executor's client), and the answer is translated to Anthropic's
// message shape, errors to {"type":"error","error":{"type","message"}}.
// Fields that do not survive the translation are refused by name, never
// silently dropped; cache_control and thinking are carried in the chat
// body as an Anthropic provider reads them (anthropic.go).
func (s *Service) messages(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	if _, err := auth.Tenant(r); err != nil {
		status, typ := http.StatusUnauthorized, "authentication_error"
		var ve *job.ValidationError
		if errors.As(err, &ve) {
			status, typ = api.StatusFor(ve.Code), wire.AnthropicErrorType(api.StatusFor(ve.Code))
		}
		s.m.JobsRejected.WithLabelValues("anthropic", "unauthorized").Inc()
		anthropicError(w, status, typ, err.Error())
		return
	}
	v := r.Header.Get("Anthropic-Version")
	if v == "" {
		anthropicError(w, http.StatusBadRequest, "invalid_request_error", "anthropic-version: header is required")
		return
	}
	if !validAnthropicVersion(v) {
		anthropicError(w, http.StatusBadRequest, "invalid_request_error",
			fmt.Sprintf("anthropic-version: %q is not a valid version (a date such as 2023-06-01)", clip.String(v, 64)))
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		var ve *job.ValidationError
		errors.As(err, &ve)
		status := http.StatusBadRequest
		if ve != nil {
			status = api.StatusFor(ve.Code)
		}
		anthropicError(w, status, wire.AnthropicErrorType(status), err.Error())
		return
	}
	chat, model, err := wire.MessagesToChat(body)
	if err != nil {
		s.m.JobsRejected.WithLabelValues("anthropic", job.CodeInvalidRequest).Inc()
		anthropicError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(chat))
	r2.ContentLength = int64(len(chat))
	rec := &captured{h: http.Header{}, real: w}
	if stream, _ := wantsStream(chat); stream {
		rec.stream = newAnthropicEvents(model)
	}
	s.chat(rec, r2, auth)
	if !rec.streamed {
		rec.writeAnthropic(w, model)
	}
}

// captured holds an OpenAI-shaped answer so it can be rewritten. For a
// stream, once the job is accepted, the relay writes the API's events
// (stream: Anthropic's, or the Responses API's) to the client's writer
// (real) instead (beginStream).
type captured struct {
	h        http.Header
	status   int
	body     bytes.Buffer
	real     http.ResponseWriter
	stream   eventFormat
	streamed bool
}

func (c *captured) Header() http.Header { return c.h }

func (c *captured) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

func (c *captured) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return c.body.Write(b)
}

// writeAnthropic writes the captured answer in Anthropic's shapes: a
// chat.completion as a message, an OpenAI error as an Anthropic error. The
// headers pass through (Retry-After, X-Sluice-Job-Id, x-request-id and
// x-ratelimit-*), with Anthropic's names added: request-id and
// anthropic-ratelimit-{requests,tokens}-{limit,remaining}.
func (c *captured) writeAnthropic(w http.ResponseWriter, model string) {
	h := w.Header()
	for k, v := range c.h {
		if k != "Content-Length" {
			h[k] = v
		}
	}
	if id := c.h.Get("X-Request-Id"); id != "" {
		h.Set("Request-Id", id)
	}
	for _, dim := range []string{"requests", "tokens"} {
		for _, kind := range []string{"limit", "remaining"} {
			if v := c.h.Get(openAIRateHeader(dim, kind)); v != "" {
				h.Set("Anthropic-Ratelimit-"+dim+"-"+kind, v)
			}
		}
	}
	if c.status == 0 {
		c.status = http.StatusInternalServerError
	}
	if c.status < 300 {
		out, err := wire.ChatToMessage(c.body.Bytes(), model)
		if err != nil {
			anthropicError(w, http.StatusBadGateway, "api_error", "the provider's answer could not be translated to a message")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(c.status)
		_, _ = w.Write(out)
		return
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := strings.TrimSpace(c.body.String())
	if json.Unmarshal(c.body.Bytes(), &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	anthropicError(w, c.status, wire.AnthropicErrorType(c.status), msg)
}

// anthropicError writes {"type":"error","error":{"type","message"},
// "request_id"}, as Anthropic does.
func anthropicError(w http.ResponseWriter, status int, typ, msg string) {
	body := map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}}
	if id := w.Header().Get(api.HeaderSluiceRequestID); id != "" {
		body["request_id"] = id
	}
	api.JSON(w, status, body)
}
