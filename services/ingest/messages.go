package ingest

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/task"
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

// messagesSurface is Anthropic's Messages API: the request becomes a chat
// body, the answer a message, events Anthropic's, errors Anthropic's
// {"type":"error","error":{"type","message"}}. model is the request's,
// set once it is decoded.
type messagesSurface struct {
	*deps
	pipe  *pipeline
	model string
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
func (s messagesSurface) serve(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	tenant, err := auth.Tenant(r)
	if err != nil {
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
	s.model = model
	s.submit(w, r, tenant, chat)
}

// submit hands the translated request to the pipeline.
func (s messagesSurface) submit(w http.ResponseWriter, r *http.Request, tenant string, chat []byte) {
	wait, release, ok := s.pipe.open(w, r, tenant, s)
	if !ok {
		return
	}
	defer release()
	err := s.checkBuilt(chat)
	var j *task.Task
	if err == nil {
		j, err = decodeChat(r, tenant, chat, "")
	}
	if err != nil {
		s.failed(w, s.failure(w, "openai", err))
		return
	}
	s.pipe.submit(w, r, s, j, chat, wait)
}

// completed answers a chat.completion as a message.
func (s messagesSurface) completed(w http.ResponseWriter, _ string, body []byte) {
	out, err := wire.ChatToMessage(body, s.model)
	if err != nil {
		anthropicError(w, http.StatusBadGateway, "api_error", "the provider's answer could not be translated to a message")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// failed answers an error in Anthropic's shape: the same status, its
// Anthropic type, the same message.
func (messagesSurface) failed(w http.ResponseWriter, e apiError) {
	anthropicError(w, e.status, wire.AnthropicErrorType(e.status), e.msg)
}

// resulted adds Anthropic's names to a result's headers: request-id (the
// provider's) and anthropic-ratelimit-{requests,tokens}-{limit,remaining}.
func (messagesSurface) resulted(h http.Header, res *job.Result) {
	if res.ProviderRequestID != "" {
		h.Set("Request-Id", res.ProviderRequestID)
	}
	for _, dim := range []string{"requests", "tokens"} {
		for _, kind := range []string{"limit", "remaining"} {
			if v := h.Get(openAIRateHeader(dim, kind)); v != "" {
				h.Set("Anthropic-Ratelimit-"+dim+"-"+kind, v)
			}
		}
	}
}

func (s messagesSurface) events(string) eventFormat { return newAnthropicEvents(s.model) }

// anthropicError writes {"type":"error","error":{"type","message"},
// "request_id"}, as Anthropic does.
func anthropicError(w http.ResponseWriter, status int, typ, msg string) {
	body := map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}}
	if id := w.Header().Get(api.HeaderSluiceRequestID); id != "" {
		body["request_id"] = id
	}
	api.JSON(w, status, body)
}
