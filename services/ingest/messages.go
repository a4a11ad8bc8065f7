package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
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
			status, typ = api.StatusFor(ve.Code), anthropicErrorType(api.StatusFor(ve.Code))
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
			fmt.Sprintf("anthropic-version: %q is not a valid version (a date such as 2023-06-01)", clip(v)))
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
		anthropicError(w, status, anthropicErrorType(status), err.Error())
		return
	}
	chat, model, err := messagesToChat(body)
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
		out, err := chatToMessage(c.body.Bytes(), model)
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
	anthropicError(w, c.status, anthropicErrorType(c.status), msg)
}

// anthropicErrorType maps an HTTP status to Anthropic's error types.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusUnprocessableEntity:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// anthropicError writes {"type":"error","error":{"type","message"}}.
func anthropicError(w http.ResponseWriter, status int, typ, msg string) {
	api.JSON(w, status, map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
}

// --- request: Anthropic Messages → OpenAI chat completions ---

// messagesFields are the request fields /v1/messages translates; any other
// is refused by name.
var messagesFields = []string{"model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p",
	"tools", "tool_choice", "metadata", "stream", "thinking"}

type anInRequest struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	Messages      []anInMessage   `json:"messages"`
	System        json.RawMessage `json:"system"`
	StopSequences []string        `json:"stop_sequences"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	Tools         []struct {
		Name         string          `json:"name"`
		Description  string          `json:"description"`
		InputSchema  json.RawMessage `json:"input_schema"`
		Type         string          `json:"type"`
		CacheControl json.RawMessage `json:"cache_control"`
	} `json:"tools"`
	ToolChoice *struct {
		Type                   string `json:"type"`
		Name                   string `json:"name"`
		DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
	} `json:"tool_choice"`
	Metadata *struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
	Stream   bool            `json:"stream"`
	Thinking json.RawMessage `json:"thinking"`
}

type anInMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anInBlock struct {
	Type   string `json:"type"`
	Text   string `json:"text"`
	Source *struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	} `json:"source"`
	ID           string          `json:"id"`
	Name         string          `json:"name"`
	Input        json.RawMessage `json:"input"`
	ToolUseID    string          `json:"tool_use_id"`
	Content      json.RawMessage `json:"content"`
	IsError      bool            `json:"is_error"`
	CacheControl json.RawMessage `json:"cache_control"`
}

type oaOutMsg struct {
	Role       string       `json:"role"`
	Content    any          `json:"content,omitempty"`
	ToolCalls  []oaToolCall `json:"tool_calls,omitempty"`
	ToolCallID string       `json:"tool_call_id,omitempty"`
	// CacheControl marks the message's last block a cache breakpoint.
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
}

type oaToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type oaPart struct {
	Type     string            `json:"type"`
	Text     string            `json:"text,omitempty"`
	ImageURL map[string]string `json:"image_url,omitempty"`
	// CacheControl marks the part a cache breakpoint.
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
}

// messagesToChat translates a Messages API body to an OpenAI chat body and
// returns it with the model named. Errors name the field at fault, the way
// Anthropic's do ("max_tokens: Field required").
func messagesToChat(body []byte) ([]byte, string, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(body, &keys); err != nil {
		return nil, "", errors.New("the request body is not a JSON object")
	}
	for k := range keys {
		if !slices.Contains(messagesFields, k) {
			return nil, "", fmt.Errorf("%s: is not supported by Sluice's /v1/messages (supported: %s)", clip(k), strings.Join(messagesFields, ", "))
		}
	}
	var in anInRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, "", job.DecodeError("", "Messages API body", err)
	}
	switch {
	case in.Model == "":
		return nil, "", errors.New("model: Field required")
	case in.MaxTokens == nil:
		return nil, "", errors.New("max_tokens: Field required")
	case len(in.Messages) == 0:
		return nil, "", errors.New("messages: at least one message is required")
	}
	out := map[string]any{"model": in.Model, "max_tokens": *in.MaxTokens}
	if in.Stream {
		// Relayed as Anthropic's events (messages_stream.go); the usage
		// chunk gives message_delta its usage.
		out["stream"] = true
		out["stream_options"] = map[string]any{"include_usage": true}
	}
	if in.Temperature != nil {
		out["temperature"] = *in.Temperature
	}
	if in.TopP != nil {
		out["top_p"] = *in.TopP
	}
	if len(in.StopSequences) > 0 {
		out["stop"] = in.StopSequences
	}
	if in.Metadata != nil && in.Metadata.UserID != "" {
		out["user"] = in.Metadata.UserID
	}
	if err := withThinking(out, in.Thinking, *in.MaxTokens); err != nil {
		return nil, "", err
	}
	var msgs []oaOutMsg
	if sys, err := systemMessage(in.System); err != nil {
		return nil, "", err
	} else if sys != nil {
		msgs = append(msgs, *sys)
	}
	for i, m := range in.Messages {
		converted, err := convertMessage(i, m)
		if err != nil {
			return nil, "", err
		}
		msgs = append(msgs, converted...)
	}
	out["messages"] = msgs
	if len(in.Tools) > 0 {
		var tools []map[string]any
		for i, t := range in.Tools {
			if t.Type != "" && t.Type != "custom" {
				return nil, "", fmt.Errorf("tools[%d].type: %q (a server tool) is not supported by Sluice's /v1/messages", i, clip(t.Type))
			}
			fn := map[string]any{"name": t.Name}
			tool := map[string]any{"type": "function", "function": fn}
			if cc := present(t.CacheControl); cc != nil {
				tool["cache_control"] = cc
			}
			if t.Description != "" {
				fn["description"] = t.Description
			}
			if len(t.InputSchema) > 0 {
				fn["parameters"] = t.InputSchema
			}
			tools = append(tools, tool)
		}
		out["tools"] = tools
	}
	if tc := in.ToolChoice; tc != nil {
		switch tc.Type {
		case "auto", "":
			out["tool_choice"] = "auto"
		case "any":
			out["tool_choice"] = "required"
		case "none":
			out["tool_choice"] = "none"
		case "tool":
			out["tool_choice"] = map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}
		default:
			return nil, "", fmt.Errorf("tool_choice.type: %q is not one of auto, any, tool, none", clip(tc.Type))
		}
		if tc.DisableParallelToolUse {
			out["parallel_tool_calls"] = false
		}
	}
	b, err := json.Marshal(out)
	return b, in.Model, err
}

// systemText reads system: a string or an array of text blocks.
func systemText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []anInBlock
	if json.Unmarshal(raw, &blocks) != nil {
		return "", errors.New("system: must be a string or an array of text blocks")
	}
	var parts []string
	for i, b := range blocks {
		if b.Type != "text" {
			return "", fmt.Errorf("system[%d].type: must be text", i)
		}
		parts = append(parts, b.Text)
	}
	return strings.Join(parts, "\n\n"), nil
}

// convertMessage translates one message. A user message's tool_result
// blocks become OpenAI tool messages (which must follow the assistant's
// tool calls), ahead of the rest of its content.
func convertMessage(i int, m anInMessage) ([]oaOutMsg, error) {
	if m.Role != "user" && m.Role != "assistant" {
		return nil, fmt.Errorf("messages[%d].role: must be user or assistant, got %q", i, clip(m.Role))
	}
	raw := bytes.TrimSpace(m.Content)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []oaOutMsg{{Role: m.Role, Content: s}}, nil
	}
	var blocks []anInBlock
	if json.Unmarshal(raw, &blocks) != nil {
		return nil, fmt.Errorf("messages[%d].content: must be a string or an array of content blocks", i)
	}
	var tools []oaOutMsg
	var parts []oaPart
	var calls []oaToolCall
	var last json.RawMessage // an assistant's breakpoint, on its message
	for j, b := range blocks {
		at := fmt.Sprintf("messages[%d].content[%d]", i, j)
		switch {
		case b.Type == "text":
			parts = append(parts, oaPart{Type: "text", Text: b.Text, CacheControl: present(b.CacheControl)})
		case b.Type == "image" && m.Role == "user":
			if b.Source == nil {
				return nil, fmt.Errorf("%s.source: Field required", at)
			}
			switch b.Source.Type {
			case "base64":
				parts = append(parts, oaPart{Type: "image_url", ImageURL: map[string]string{"url": "data:" + b.Source.MediaType + ";base64," + b.Source.Data}, CacheControl: present(b.CacheControl)})
			case "url":
				parts = append(parts, oaPart{Type: "image_url", ImageURL: map[string]string{"url": b.Source.URL}, CacheControl: present(b.CacheControl)})
			default:
				return nil, fmt.Errorf("%s.source.type: must be base64 or url", at)
			}
		case b.Type == "tool_use" && m.Role == "assistant":
			tc := oaToolCall{ID: b.ID, Type: "function"}
			tc.Function.Name = b.Name
			tc.Function.Arguments = "{}"
			if len(bytes.TrimSpace(b.Input)) > 0 {
				tc.Function.Arguments = string(b.Input)
			}
			calls = append(calls, tc)
			if cc := present(b.CacheControl); cc != nil {
				last = cc
			}
		case b.Type == "tool_result" && m.Role == "user":
			text, err := toolResultText(b.Content)
			if err != nil {
				return nil, fmt.Errorf("%s.content: %w", at, err)
			}
			if b.IsError {
				text = "Error: " + text
			}
			tools = append(tools, oaOutMsg{Role: "tool", ToolCallID: b.ToolUseID, Content: text, CacheControl: present(b.CacheControl)})
		default:
			return nil, fmt.Errorf("%s.type: %q is not supported in a %s message by Sluice's /v1/messages", at, clip(b.Type), m.Role)
		}
	}
	out := tools
	if m.Role == "assistant" {
		var text strings.Builder
		for _, p := range parts {
			text.WriteString(p.Text)
			if p.CacheControl != nil {
				last = p.CacheControl
			}
		}
		msg := oaOutMsg{Role: "assistant", ToolCalls: calls, CacheControl: last}
		if text.Len() > 0 || len(calls) == 0 {
			msg.Content = text.String()
		}
		return append(out, msg), nil
	}
	switch {
	case len(parts) == 1 && parts[0].Type == "text" && parts[0].CacheControl == nil:
		out = append(out, oaOutMsg{Role: "user", Content: parts[0].Text})
	case len(parts) > 0:
		out = append(out, oaOutMsg{Role: "user", Content: parts})
	case len(tools) == 0:
		return nil, fmt.Errorf("messages[%d].content: must not be empty", i)
	}
	return out, nil
}

// toolResultText reads a tool_result's content: a string or text blocks.
func toolResultText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []anInBlock
	if json.Unmarshal(raw, &blocks) != nil {
		return "", errors.New("must be a string or an array of text blocks")
	}
	var b strings.Builder
	for _, blk := range blocks {
		if blk.Type != "text" {
			return "", fmt.Errorf("block type %q is not supported (text only)", clip(blk.Type))
		}
		b.WriteString(blk.Text)
	}
	return b.String(), nil
}

// --- response: OpenAI chat.completion → Anthropic message ---

type chatCompletion struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content   *string      `json:"content"`
			Refusal   *string      `json:"refusal"`
			ToolCalls []oaToolCall `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage chatUsage `json:"usage"`
}

// chatUsage is a chat completion's (or a usage chunk's) usage.
type chatUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	// CacheCreationInputTokens is what an Anthropic provider wrote to its
	// cache (part of PromptTokens).
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
}

// split returns the input tokens as Anthropic counts them: those neither
// read from the cache nor written to it (input_tokens), those read from
// it (cache_read_input_tokens) and those written (cache_creation_input_tokens).
func (u chatUsage) split() (input, cached, written int) {
	if d := u.PromptTokensDetails; d != nil {
		cached = d.CachedTokens
	}
	written = max(min(u.CacheCreationInputTokens, u.PromptTokens-cached), 0)
	return max(u.PromptTokens-cached-written, 0), cached, written
}

// stopReason maps an OpenAI finish_reason to Anthropic's stop_reason.
func stopReason(finish string) string {
	switch finish {
	case "length":
		return "max_tokens"
	case "tool_calls", "function_call":
		return "tool_use"
	case "content_filter":
		return "refusal"
	}
	return "end_turn"
}

// messageID makes a message id of a completion's: msg_ and its suffix.
func messageID(id string) string {
	if strings.HasPrefix(id, "msg_") {
		return id
	}
	return "msg_" + strings.TrimPrefix(id, "chatcmpl-")
}

type anOutBlock struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

// chatToMessage translates a chat.completion (its first choice) to a
// Messages API message. Usage: input_tokens excludes cached input, which
// is cache_read_input_tokens, as Anthropic counts them.
func chatToMessage(body []byte, model string) ([]byte, error) {
	var in chatCompletion
	if err := json.Unmarshal(body, &in); err != nil || len(in.Choices) == 0 {
		return nil, errors.New("not a chat.completion")
	}
	ch := in.Choices[0]
	content := []anOutBlock{}
	text := ""
	switch {
	case ch.Message.Content != nil:
		text = *ch.Message.Content
	case ch.Message.Refusal != nil:
		text = *ch.Message.Refusal
	}
	if text != "" || len(ch.Message.ToolCalls) == 0 {
		content = append(content, anOutBlock{Type: "text", Text: &text})
	}
	for _, tc := range ch.Message.ToolCalls {
		input := json.RawMessage(`{}`)
		if a := strings.TrimSpace(tc.Function.Arguments); a != "" && json.Valid([]byte(a)) {
			input = json.RawMessage(a)
		}
		content = append(content, anOutBlock{Type: "tool_use", ID: tc.ID, Name: tc.Function.Name, Input: input})
	}
	if in.Model != "" {
		model = in.Model
	}
	input, cached, written := in.Usage.split()
	return json.Marshal(map[string]any{
		"id": messageID(in.ID), "type": "message", "role": "assistant", "model": model,
		"content": content, "stop_reason": stopReason(ch.FinishReason), "stop_sequence": nil,
		"usage": map[string]any{
			"input_tokens":                input,
			"output_tokens":               in.Usage.CompletionTokens,
			"cache_read_input_tokens":     cached,
			"cache_creation_input_tokens": written,
		},
	})
}
