package wire

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// ChatToResponses translates a chat-completions body (as a Responses
// request became at the front door) into a Responses API request, for a
// provider that serves the Responses API natively. System messages become
// the instructions, tool calls and results function_call and
// function_call_output items; store is false, since Sluice keeps the
// conversation and sends it whole.
func ChatToResponses(chat []byte) ([]byte, error) {
	var in struct {
		Model               string          `json:"model"`
		Messages            []chatIn        `json:"messages"`
		Tools               []chatTool      `json:"tools"`
		ToolChoice          json.RawMessage `json:"tool_choice"`
		ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
		MaxTokens           *int            `json:"max_tokens"`
		MaxCompletionTokens *int            `json:"max_completion_tokens"`
		Temperature         *float64        `json:"temperature"`
		TopP                *float64        `json:"top_p"`
		User                string          `json:"user"`
		ReasoningEffort     string          `json:"reasoning_effort"`
		ResponseFormat      *struct {
			Type       string `json:"type"`
			JSONSchema *struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Schema      json.RawMessage `json:"schema"`
				Strict      *bool           `json:"strict"`
			} `json:"json_schema"`
		} `json:"response_format"`
		Stream bool    `json:"stream"`
		Native *Native `json:"sluice_responses"`
	}
	if json.Unmarshal(chat, &in) != nil {
		return nil, errors.New("malformed chat-completions body")
	}
	out := map[string]any{"model": in.Model, "store": false}
	instructions, input, err := responsesInput(in.Messages)
	if err != nil {
		return nil, err
	}
	if instructions != "" {
		out["instructions"] = instructions
	}
	out["input"] = input
	if len(in.Tools) > 0 {
		out["tools"] = responsesTools(in.Tools)
	}
	if tc, ok := responsesToolChoice(in.ToolChoice); ok {
		out["tool_choice"] = tc
	}
	if in.ParallelToolCalls != nil {
		out["parallel_tool_calls"] = *in.ParallelToolCalls
	}
	switch {
	case in.MaxCompletionTokens != nil:
		out["max_output_tokens"] = *in.MaxCompletionTokens
	case in.MaxTokens != nil:
		out["max_output_tokens"] = *in.MaxTokens
	}
	if in.Temperature != nil {
		out["temperature"] = *in.Temperature
	}
	if in.TopP != nil {
		out["top_p"] = *in.TopP
	}
	if in.User != "" {
		out["user"] = in.User
	}
	if in.ReasoningEffort != "" {
		out["reasoning"] = map[string]any{"effort": in.ReasoningEffort}
	}
	if rf := in.ResponseFormat; rf != nil {
		switch {
		case rf.Type == "json_object":
			out["text"] = map[string]any{"format": map[string]any{"type": "json_object"}}
		case rf.Type == "json_schema" && rf.JSONSchema != nil:
			f := map[string]any{"type": "json_schema", "name": rf.JSONSchema.Name, "schema": rf.JSONSchema.Schema}
			if rf.JSONSchema.Description != "" {
				f["description"] = rf.JSONSchema.Description
			}
			if rf.JSONSchema.Strict != nil {
				f["strict"] = *rf.JSONSchema.Strict
			}
			out["text"] = map[string]any{"format": f}
		}
	}
	if in.Stream {
		out["stream"] = true
	}
	if n := in.Native; n != nil {
		n.apply(out)
	}
	return marshal(out)
}

// responsesToolChoice is a chat tool_choice in the Responses shape: a
// string as it is, a named function as {type, name}; false when absent or
// neither.
func responsesToolChoice(raw json.RawMessage) (any, bool) {
	tc := present(raw)
	if tc == nil {
		return nil, false
	}
	var s string
	var f struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	switch {
	case json.Unmarshal(tc, &s) == nil:
		return s, true
	case json.Unmarshal(tc, &f) == nil && f.Function.Name != "":
		return map[string]any{"type": "function", "name": f.Function.Name}, true
	}
	return nil, false
}

// apply puts the request's own items and tools, as the caller sent them,
// in place of what was translated from the chat body.
func (n *Native) apply(out map[string]any) {
	delete(out, "instructions")
	if n.Instructions != nil && *n.Instructions != "" {
		out["instructions"] = *n.Instructions
	}
	out["input"] = n.Input
	if len(n.Tools) > 0 {
		out["tools"] = n.Tools
	}
	if n.ToolChoice != nil {
		out["tool_choice"] = n.ToolChoice
	}
	if len(n.Include) > 0 {
		out["include"] = n.Include
	}
	if n.Reasoning != nil {
		out["reasoning"] = n.Reasoning
	}
}

// responsesInput splits chat messages into Responses instructions (the
// system and developer messages) and input items.
func responsesInput(msgs []chatIn) (string, []map[string]any, error) {
	var instructions []string
	var input []map[string]any
	for _, m := range msgs {
		switch m.Role {
		case "system", "developer":
			instructions = append(instructions, chatText(m.Content))
		case "user":
			input = append(input, map[string]any{"type": "message", "role": "user", "content": userParts(m.Content)})
		case "assistant":
			if t := chatText(m.Content); t != "" {
				input = append(input, map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": t, "annotations": []any{}}}})
			}
			for _, tc := range m.ToolCalls {
				input = append(input, map[string]any{"type": "function_call", "call_id": tc.ID, "name": tc.Function.Name, "arguments": tc.Function.Arguments})
			}
		case "tool":
			input = append(input, map[string]any{"type": "function_call_output", "call_id": m.ToolCallID, "output": chatText(m.Content)})
		default:
			return "", nil, errors.New("message role " + clip.String(m.Role, 64) + " has no Responses form")
		}
	}
	return strings.Join(instructions, "\n\n"), input, nil
}

// responsesTools are chat function tools as Responses function tools.
func responsesTools(in []chatTool) []map[string]any {
	tools := make([]map[string]any, 0, len(in))
	for _, t := range in {
		f := map[string]any{"type": "function", "name": t.Function.Name}
		if t.Function.Description != "" {
			f["description"] = t.Function.Description
		}
		if p := present(t.Function.Parameters); p != nil {
			f["parameters"] = p
		}
		if t.Function.Strict != nil {
			f["strict"] = *t.Function.Strict
		}
		tools = append(tools, f)
	}
	return tools
}

type chatIn struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []ChatToolCall  `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type chatTool struct {
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
		Strict      *bool           `json:"strict"`
	} `json:"function"`
}

// chatText is a chat message's text: a string, or its text parts joined.
func chatText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// userParts is a user message's content as Responses input parts.
func userParts(raw json.RawMessage) any {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL struct {
			URL    string `json:"url"`
			Detail string `json:"detail"`
		} `json:"image_url"`
	}
	_ = json.Unmarshal(raw, &parts)
	out := make([]map[string]any, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case "image_url":
			img := map[string]any{"type": "input_image", "image_url": p.ImageURL.URL}
			if p.ImageURL.Detail != "" {
				img["detail"] = p.ImageURL.Detail
			}
			out = append(out, img)
		default:
			out = append(out, map[string]any{"type": "input_text", "text": p.Text})
		}
	}
	return out
}

// nativeResponse is the part of a Response the translation to chat reads.
type nativeResponse struct {
	ID                string `json:"id"`
	CreatedAt         int64  `json:"created_at"`
	Model             string `json:"model"`
	Status            string `json:"status"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []struct {
		Type      string `json:"type"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
		Content   []struct {
			Type    string `json:"type"`
			Text    string `json:"text"`
			Refusal string `json:"refusal"`
		} `json:"content"`
	} `json:"output"`
	Usage *Usage `json:"usage"`
}

// chatFinish is the chat finish_reason for a Response's outcome.
func (r *nativeResponse) chatFinish(calls bool) string {
	if r.Status == StatusIncomplete && r.IncompleteDetails != nil {
		if r.IncompleteDetails.Reason == ReasonContentFilter {
			return "content_filter"
		}
		return "length"
	}
	if calls {
		return "tool_calls"
	}
	return "stop"
}

// chatUsageOf is a Response usage in chat's shape.
func chatUsageOf(u *Usage) map[string]any {
	if u == nil {
		return nil
	}
	return map[string]any{"prompt_tokens": u.InputTokens, "completion_tokens": u.OutputTokens, "total_tokens": u.TotalTokens,
		"prompt_tokens_details":     map[string]int{"cached_tokens": u.InputTokensDetails.CachedTokens},
		"completion_tokens_details": map[string]int{"reasoning_tokens": u.OutputTokensDetails.ReasoningTokens}}
}

// ResponseToChat translates a provider's Response into the chat.completion
// the mesh carries: the message text, function calls as tool calls, the
// finish reason and the usage.
func ResponseToChat(body []byte) ([]byte, error) {
	var r nativeResponse
	if json.Unmarshal(body, &r) != nil || r.Status == "" {
		return nil, errors.New("not a Response")
	}
	var raw struct {
		Output []json.RawMessage `json:"output"`
	}
	_ = json.Unmarshal(body, &raw)
	var items []json.RawMessage
	for _, it := range raw.Output {
		if !chatItem(itemType(it)) {
			items = append(items, it)
		}
	}
	var text strings.Builder
	var calls []ChatToolCall
	for _, it := range r.Output {
		switch it.Type {
		case "message":
			for _, p := range it.Content {
				text.WriteString(p.Text)
				text.WriteString(p.Refusal)
			}
		case "function_call":
			tc := ChatToolCall{ID: it.CallID, Type: "function"}
			tc.Function.Name, tc.Function.Arguments = it.Name, it.Arguments
			calls = append(calls, tc)
		}
	}
	msg := map[string]any{"role": "assistant", "content": text.String()}
	if len(calls) > 0 {
		msg["tool_calls"] = calls
		if text.Len() == 0 {
			msg["content"] = nil
		}
	}
	out := map[string]any{"id": r.ID, "object": "chat.completion", "created": r.CreatedAt, "model": r.Model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "logprobs": nil, "finish_reason": r.chatFinish(len(calls) > 0)}}}
	if u := chatUsageOf(r.Usage); u != nil {
		out["usage"] = u
	}
	if len(items) > 0 {
		out[job.ItemsMember] = items
	}
	return marshal(out)
}

// NativeStream translates a provider's Responses event stream into chat
// chunks, one event at a time (Event).
type NativeStream struct {
	id, model string
	created   int64
	calls     map[int]int // output_index -> tool call index
}

// NewNativeStream returns a translator; created stamps its chunks until
// the provider's response.created names its own.
func NewNativeStream(created int64) *NativeStream {
	return &NativeStream{created: created, calls: map[int]int{}}
}

// ErrStreamFailed is returned by Event for a response.failed or error
// event; body is the error in OpenAI's shape.
type ErrStreamFailed struct{ Body []byte }

func (e *ErrStreamFailed) Error() string { return "the provider's response failed" }

func (s *NativeStream) chunk(delta map[string]any, finish *string) []byte {
	b, _ := marshal(map[string]any{"id": s.id, "object": "chat.completion.chunk", "created": s.created, "model": s.model,
		"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}})
	return b
}

// Event translates one event's data: the chunks it makes, whether it ends
// the stream, and an *ErrStreamFailed for a failure.
func (s *NativeStream) Event(data []byte) (chunks [][]byte, done bool, err error) {
	var ev struct {
		Type        string          `json:"type"`
		Response    json.RawMessage `json:"response"`
		OutputIndex int             `json:"output_index"`
		Delta       string          `json:"delta"`
		Item        struct {
			Type   string `json:"type"`
			CallID string `json:"call_id"`
			Name   string `json:"name"`
		} `json:"item"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return nil, false, &ErrStreamFailed{Body: []byte(`{"error":{"message":"undecodable stream event","type":"server_error"}}`)}
	}
	switch ev.Type {
	case "response.created":
		var r nativeResponse
		_ = json.Unmarshal(ev.Response, &r)
		s.id, s.model = r.ID, r.Model
		if r.CreatedAt > 0 {
			s.created = r.CreatedAt
		}
		return [][]byte{s.chunk(map[string]any{"role": "assistant", "content": ""}, nil)}, false, nil
	case "response.output_text.delta", "response.refusal.delta":
		if ev.Delta == "" {
			return nil, false, nil
		}
		return [][]byte{s.chunk(map[string]any{"content": ev.Delta}, nil)}, false, nil
	case "response.output_item.added":
		if ev.Item.Type != "function_call" {
			return nil, false, nil
		}
		n := len(s.calls)
		s.calls[ev.OutputIndex] = n
		return [][]byte{s.chunk(map[string]any{"tool_calls": []any{map[string]any{"index": n, "id": ev.Item.CallID, "type": "function",
			"function": map[string]any{"name": ev.Item.Name, "arguments": ""}}}}, nil)}, false, nil
	case "response.output_item.done":
		var done struct {
			Item json.RawMessage `json:"item"`
		}
		if json.Unmarshal(data, &done) != nil || chatItem(itemType(done.Item)) {
			return nil, false, nil
		}
		b, _ := marshal(map[string]any{"id": s.id, "object": "chat.completion.chunk", "created": s.created, "model": s.model, "choices": []any{},
			job.ItemsMember: []json.RawMessage{done.Item}})
		return [][]byte{b}, false, nil
	case "response.function_call_arguments.delta":
		n, ok := s.calls[ev.OutputIndex]
		if !ok || ev.Delta == "" {
			return nil, false, nil
		}
		return [][]byte{s.chunk(map[string]any{"tool_calls": []any{map[string]any{"index": n, "function": map[string]any{"arguments": ev.Delta}}}}, nil)}, false, nil
	case "response.completed", "response.incomplete":
		var r nativeResponse
		_ = json.Unmarshal(ev.Response, &r)
		finish := r.chatFinish(len(s.calls) > 0)
		out := [][]byte{s.chunk(map[string]any{}, &finish)}
		if u := chatUsageOf(r.Usage); u != nil {
			b, _ := marshal(map[string]any{"id": s.id, "object": "chat.completion.chunk", "created": s.created, "model": s.model, "choices": []any{}, "usage": u})
			out = append(out, b)
		}
		return out, true, nil
	case "response.failed":
		var r struct {
			Error *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		_ = json.Unmarshal(ev.Response, &r)
		code, msg := "server_error", "the response failed"
		if r.Error != nil {
			code, msg = r.Error.Code, r.Error.Message
		}
		return nil, false, &ErrStreamFailed{Body: errorBody(code, msg)}
	case "error":
		return nil, false, &ErrStreamFailed{Body: errorBody(ev.Code, ev.Message)}
	}
	return nil, false, nil // in_progress, part and .done events carry nothing new
}

func errorBody(code, msg string) []byte {
	if code == "" {
		code = "server_error"
	}
	b, _ := marshal(map[string]any{"error": map[string]any{"message": msg, "type": "server_error", "code": code, "param": nil}})
	return b
}
