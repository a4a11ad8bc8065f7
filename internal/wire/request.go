package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Request is a Responses API request body, the fields Sluice translates.
// Any other field is refused by name (ParseRequest), never dropped.
type Request struct {
	Model              string            `json:"model"`
	Instructions       *string           `json:"instructions"`
	Input              json.RawMessage   `json:"input"`
	Tools              []json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Temperature        *float64          `json:"temperature"`
	TopP               *float64          `json:"top_p"`
	Text               json.RawMessage   `json:"text"`
	Metadata           map[string]string `json:"metadata"`
	Store              *bool             `json:"store"`
	Stream             bool              `json:"stream"`
	PreviousResponseID string            `json:"previous_response_id"`
	User               string            `json:"user"`
	Reasoning          json.RawMessage   `json:"reasoning"`
	Truncation         string            `json:"truncation"`
	Include            []string          `json:"include"`
	StreamOpts         json.RawMessage   `json:"stream_options"`
}

// requestFields are the members a Responses request may have.
var requestFields = []string{"model", "instructions", "input", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
	"temperature", "top_p", "text", "metadata", "store", "stream", "previous_response_id", "user", "reasoning", "truncation",
	"include", "stream_options"}

// Error is a request that cannot be translated: Param names the field.
type Error struct {
	Param string
	Msg   string
}

func (e *Error) Error() string {
	if e.Param == "" {
		return e.Msg
	}
	return e.Param + ": " + e.Msg
}

func errf(param, format string, args ...any) *Error {
	return &Error{Param: param, Msg: fmt.Sprintf(format, args...)}
}

// ParseRequest reads and checks a Responses request. Errors never quote
// request content beyond a clipped field name.
func ParseRequest(body []byte) (*Request, error) {
	if err := job.CheckMembers("", body, (*Request)(nil)); err != nil {
		var ve *job.ValidationError
		errors.As(err, &ve)
		return nil, &Error{Param: ve.Field, Msg: ve.Message}
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return nil, errf("", "the body must be a JSON object")
	}
	for name := range members {
		if !slices.Contains(requestFields, name) {
			return nil, errf(clip.String(name, 64), "is not supported by Sluice's /v1/responses (supported: %s)", strings.Join(requestFields, ", "))
		}
	}
	var r Request
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, errf("", "malformed Responses request: a field has the wrong type")
	}
	if r.Model == "" {
		return nil, errf("model", "is required")
	}
	if in := bytes.TrimSpace(r.Input); len(in) == 0 || string(in) == "null" {
		return nil, errf("input", "is required: a string or a list of items")
	}
	if r.MaxOutputTokens != nil && *r.MaxOutputTokens < 1 {
		return nil, errf("max_output_tokens", "must be positive, got %d", *r.MaxOutputTokens)
	}
	if present(r.Reasoning) != nil {
		var re struct {
			Effort string `json:"effort"`
		}
		if json.Unmarshal(r.Reasoning, &re) != nil {
			return nil, errf("reasoning", "must be an object")
		}
	}
	if r.Truncation != "" && r.Truncation != "disabled" {
		return nil, errf("truncation", "only \"disabled\" is supported")
	}
	for i, t := range r.Tools {
		var tool struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if json.Unmarshal(t, &tool) != nil {
			return nil, errf(fmt.Sprintf("tools[%d]", i), "must be an object")
		}
		if tool.Type == "" {
			return nil, errf(fmt.Sprintf("tools[%d].type", i), "is required")
		}
		// A built-in tool is checked against the model's provider
		// (BuiltinTools): only one serving the Responses API runs it.
		if tool.Type == "function" && tool.Name == "" {
			return nil, errf(fmt.Sprintf("tools[%d].name", i), "is required")
		}
	}
	return &r, nil
}

// Stored reports whether the response is to be kept (store defaults to
// true, as OpenAI's does).
func (r *Request) Stored() bool { return r.Store == nil || *r.Store }

// ChatMessage is one chat-completions message as Sluice writes them.
type ChatMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content"`
	ToolCalls  []ChatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	Name       string         `json:"name,omitempty"`
}

// ChatToolCall is an assistant message's tool call.
type ChatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// item is one input item, every shape's fields.
type item struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// InputMessages translates the request's input (this turn's, not the
// history a previous response holds) to chat messages, for a model
// translated to chat (ChatMessages).
func (r *Request) InputMessages() ([]ChatMessage, error) {
	items, err := r.Items()
	if err != nil {
		return nil, err
	}
	out, err := ChatMessages(items, false)
	if err == nil && len(out) == 0 {
		return nil, errf("input", "holds no message")
	}
	return out, err
}

// messageItem translates a message item (an easy message or an output
// message passed back).
func messageItem(param string, it item) (ChatMessage, error) {
	role := it.Role
	switch role {
	case "user", "assistant", "system":
	case "developer":
		role = "system"
	default:
		return ChatMessage{}, errf(param+".role", "must be user, assistant, system or developer, got %q", clip.String(it.Role, 64))
	}
	c := bytes.TrimSpace(it.Content)
	var s string
	if json.Unmarshal(c, &s) == nil {
		return ChatMessage{Role: role, Content: s}, nil
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		Refusal  string `json:"refusal"`
		ImageURL string `json:"image_url"`
		FileID   string `json:"file_id"`
		Detail   string `json:"detail"`
	}
	if json.Unmarshal(c, &parts) != nil {
		return ChatMessage{}, errf(param+".content", "must be a string or a list of content parts")
	}
	var text strings.Builder
	var chat []map[string]any
	images := false
	for j, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			text.WriteString(p.Text)
			chat = append(chat, map[string]any{"type": "text", "text": p.Text})
		case "refusal":
			text.WriteString(p.Refusal)
			chat = append(chat, map[string]any{"type": "text", "text": p.Refusal})
		case "input_image":
			if p.ImageURL == "" || role != "user" {
				return ChatMessage{}, errf(fmt.Sprintf("%s.content[%d]", param, j), "an input_image needs an image_url (file ids are not supported) in a user message")
			}
			img := map[string]any{"url": p.ImageURL}
			if p.Detail != "" {
				img["detail"] = p.Detail
			}
			chat = append(chat, map[string]any{"type": "image_url", "image_url": img})
			images = true
		default:
			return ChatMessage{}, errf(fmt.Sprintf("%s.content[%d].type", param, j), "content type %q is not supported through Sluice", clip.String(p.Type, 64))
		}
	}
	if images {
		return ChatMessage{Role: role, Content: chat}, nil
	}
	return ChatMessage{Role: role, Content: text.String()}, nil
}

// outputText reads a function_call_output's output: a string, or a list of
// input_text parts.
func outputText(raw json.RawMessage) (string, *Error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return "", &Error{Msg: "must be a string or a list of input_text parts"}
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "input_text" && p.Type != "output_text" {
			return "", &Error{Msg: fmt.Sprintf("part type %q is not supported", clip.String(p.Type, 64))}
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// ChatOptions shape the chat body.
type ChatOptions struct {
	// MaxTokensField is the member max_output_tokens becomes:
	// "max_tokens" (the default) or "max_completion_tokens".
	MaxTokensField string
	// Native, when set, is carried in the body's NativeMember.
	Native *Native
}

// ChatBody is the chat-completions body for r: its instructions as the
// system message, then history (the messages of the previous responses
// in the chain), then input (InputMessages).
func (r *Request) ChatBody(history, input []ChatMessage, o ChatOptions) ([]byte, error) {
	out := map[string]any{"model": r.Model}
	var msgs []ChatMessage
	if r.Instructions != nil && *r.Instructions != "" {
		msgs = append(msgs, ChatMessage{Role: "system", Content: *r.Instructions})
	}
	msgs = append(msgs, history...)
	msgs = append(msgs, input...)
	out["messages"] = msgs
	if len(r.Tools) > 0 {
		tools := make([]map[string]any, 0, len(r.Tools))
		for _, t := range r.Tools {
			if toolType(t) != "function" {
				continue // built-in: in the Native member only
			}
			var f struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
				Strict      *bool           `json:"strict"`
			}
			if json.Unmarshal(t, &f) != nil {
				return nil, errf("tools", "must be function tools")
			}
			fn := map[string]any{"name": f.Name}
			if f.Description != "" {
				fn["description"] = f.Description
			}
			if p := present(f.Parameters); p != nil {
				fn["parameters"] = p
			}
			if f.Strict != nil {
				fn["strict"] = *f.Strict
			}
			tools = append(tools, map[string]any{"type": "function", "function": fn})
		}
		if len(tools) > 0 {
			out["tools"] = tools
		}
	}
	if tc := present(r.ToolChoice); tc != nil && !builtinChoice(tc) {
		choice, err := chatToolChoice(tc)
		if err != nil {
			return nil, err
		}
		out["tool_choice"] = choice
	}
	if _, tools := out["tools"]; r.ParallelToolCalls != nil && tools {
		out["parallel_tool_calls"] = *r.ParallelToolCalls
	}
	if r.MaxOutputTokens != nil {
		key := o.MaxTokensField
		if key == "" {
			key = "max_tokens"
		}
		out[key] = *r.MaxOutputTokens
	}
	if r.Temperature != nil {
		out["temperature"] = *r.Temperature
	}
	if r.TopP != nil {
		out["top_p"] = *r.TopP
	}
	if r.User != "" {
		out["user"] = r.User
	}
	var re struct {
		Effort string `json:"effort"`
	}
	if json.Unmarshal(present(r.Reasoning), &re) == nil && re.Effort != "" {
		out["reasoning_effort"] = re.Effort
	}
	if f, err := chatResponseFormat(r.Text); err != nil {
		return nil, err
	} else if f != nil {
		out["response_format"] = f
	}
	if r.Stream {
		out["stream"] = true
		// The usage chunk carries what response.completed reports.
		out["stream_options"] = map[string]any{"include_usage": true}
	}
	if o.Native != nil {
		out[NativeMember] = o.Native
	}
	return marshal(out)
}

// chatToolChoice translates tool_choice: "auto", "none", "required", or
// {"type":"function","name":...}.
func chatToolChoice(raw json.RawMessage) (any, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none", "required":
			return s, nil
		}
		return nil, errf("tool_choice", "must be auto, none, required or a function, got %q", clip.String(s, 64))
	}
	var f struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &f) != nil || f.Type != "function" || f.Name == "" {
		return nil, errf("tool_choice", "only function tools can be chosen ({\"type\":\"function\",\"name\":...})")
	}
	return map[string]any{"type": "function", "function": map[string]any{"name": f.Name}}, nil
}

// chatResponseFormat translates text.format to response_format.
func chatResponseFormat(text json.RawMessage) (any, error) {
	if present(text) == nil {
		return nil, nil
	}
	var t struct {
		Format *struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Schema      json.RawMessage `json:"schema"`
			Strict      *bool           `json:"strict"`
		} `json:"format"`
		Verbosity string `json:"verbosity"`
	}
	if json.Unmarshal(text, &t) != nil {
		return nil, errf("text", "must be an object")
	}
	if t.Format == nil {
		return nil, nil
	}
	switch t.Format.Type {
	case "text", "":
		return nil, nil
	case "json_object":
		return map[string]any{"type": "json_object"}, nil
	case "json_schema":
		if t.Format.Name == "" || present(t.Format.Schema) == nil {
			return nil, errf("text.format", "a json_schema format needs name and schema")
		}
		js := map[string]any{"name": t.Format.Name, "schema": t.Format.Schema}
		if t.Format.Description != "" {
			js["description"] = t.Format.Description
		}
		if t.Format.Strict != nil {
			js["strict"] = *t.Format.Strict
		}
		return map[string]any{"type": "json_schema", "json_schema": js}, nil
	}
	return nil, errf("text.format.type", "must be text, json_object or json_schema, got %q", clip.String(t.Format.Type, 64))
}

// present returns raw, or nil when it is absent or JSON null.
func present(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

// marshal encodes v without HTML escaping (prompts keep their bytes).
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}
