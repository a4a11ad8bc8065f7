package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Anthropic's Messages API <-> OpenAI chat completions, for POST
// /v1/messages: the request becomes a chat body (MessagesToChat) that runs
// as any chat job; the answer becomes a message (ChatToMessage) or
// Anthropic's event stream (MessageEvents).
//
// Prompt caching and extended thinking on /v1/messages: a breakpoint
// (cache_control) on a system block, a content block or a tool is carried
// in the chat body on the part, tool or message it marks, and thinking as
// a top-level member, so an Anthropic provider receives them as sent (and
// admission reserves a warm prefix net of the cache read).

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
	Role       string         `json:"role"`
	Content    any            `json:"content,omitempty"`
	ToolCalls  []ChatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	// CacheControl marks the message's last block a cache breakpoint.
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
}

type msgPart struct {
	Type     string            `json:"type"`
	Text     string            `json:"text,omitempty"`
	ImageURL map[string]string `json:"image_url,omitempty"`
	// CacheControl marks the part a cache breakpoint.
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
}

// decodeMessages reads a Messages API body with one reading only (no
// member named twice, in any spelling) and only the members Sluice
// supports.
func decodeMessages(body []byte) (anInRequest, error) {
	var in anInRequest
	if err := job.CheckMembers("", body, (*anInRequest)(nil)); err != nil {
		return in, err
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(body, &keys); err != nil {
		return in, errors.New("the request body is not a JSON object")
	}
	for k := range keys {
		if !slices.Contains(messagesFields, k) {
			return in, fmt.Errorf("%s: is not supported by Sluice's /v1/messages (supported: %s)", clip.String(k, 64), strings.Join(messagesFields, ", "))
		}
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return in, job.DecodeError("", "Messages API body", err)
	}
	return in, checkMessages(keys)
}

// messagesRanges are the Messages API's sampling ranges.
var messagesRanges = []numRange{{field: "temperature", min: 0, max: 1}, {field: "top_p", min: 0, max: 1}}

// checkMessages refuses what Anthropic would refuse as malformed in a
// body decodeMessages read: a sampling value out of range, a message
// member other than role and content (system is top-level there).
func checkMessages(top map[string]json.RawMessage) error {
	if err := checkRanges(top, messagesRanges, "", json.Unmarshal); err != nil {
		var ve *job.ValidationError
		errors.As(err, &ve)
		return errors.New(strings.TrimPrefix(ve.Error(), "request."))
	}
	var msgs []map[string]json.RawMessage
	if json.Unmarshal(top["messages"], &msgs) != nil {
		return nil // decodeMessages read them: only a null is left
	}
	for i, m := range msgs {
		for name := range m {
			if name != "role" && name != "content" {
				return fmt.Errorf("messages[%d].%s: Extra inputs are not permitted (a message has role and content; system is top-level)", i, clip.String(name, 64))
			}
		}
		if present(m["content"]) == nil {
			return fmt.Errorf("messages[%d].content: Field required", i)
		}
	}
	return nil
}

// MessagesToChat translates a Messages API body to an OpenAI chat body and
// returns it with the model named. Errors name the field at fault, the way
// Anthropic's do ("max_tokens: Field required").
func MessagesToChat(body []byte) ([]byte, string, error) {
	in, err := decodeMessages(body)
	if err != nil {
		return nil, "", err
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
				return nil, "", fmt.Errorf("tools[%d].type: %q (a server tool) is not supported by Sluice's /v1/messages", i, clip.String(t.Type, 64))
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
			return nil, "", fmt.Errorf("tool_choice.type: %q is not one of auto, any, tool, none", clip.String(tc.Type, 64))
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
		return nil, fmt.Errorf("messages[%d].role: must be user or assistant, got %q", i, clip.String(m.Role, 64))
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
	var parts []msgPart
	var calls []ChatToolCall
	var last json.RawMessage // an assistant's breakpoint, on its message
	for j, b := range blocks {
		at := fmt.Sprintf("messages[%d].content[%d]", i, j)
		switch {
		case b.Type == "text":
			parts = append(parts, msgPart{Type: "text", Text: b.Text, CacheControl: present(b.CacheControl)})
		case b.Type == "image" && m.Role == "user":
			if b.Source == nil {
				return nil, fmt.Errorf("%s.source: Field required", at)
			}
			switch b.Source.Type {
			case "base64":
				parts = append(parts, msgPart{Type: "image_url", ImageURL: map[string]string{"url": "data:" + b.Source.MediaType + ";base64," + b.Source.Data}, CacheControl: present(b.CacheControl)})
			case "url":
				parts = append(parts, msgPart{Type: "image_url", ImageURL: map[string]string{"url": b.Source.URL}, CacheControl: present(b.CacheControl)})
			default:
				return nil, fmt.Errorf("%s.source.type: must be base64 or url", at)
			}
		case b.Type == "tool_use" && m.Role == "assistant":
			tc := ChatToolCall{ID: b.ID, Type: "function"}
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
			return nil, fmt.Errorf("%s.type: %q is not supported in a %s message by Sluice's /v1/messages", at, clip.String(b.Type, 64), m.Role)
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
			return "", fmt.Errorf("block type %q is not supported (text only)", clip.String(blk.Type, 64))
		}
		b.WriteString(blk.Text)
	}
	return b.String(), nil
}

// --- response: OpenAI chat.completion → Anthropic message ---

type msgCompletion struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Message      chatReply `json:"message"`
		FinishReason string    `json:"finish_reason"`
	} `json:"choices"`
	Usage ChatUsage `json:"usage"`
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

// ChatToMessage translates a chat.completion (its first choice) to a
// Messages API message. Usage: input_tokens excludes cached input, which
// is cache_read_input_tokens, as Anthropic counts them.
func ChatToMessage(body []byte, model string) ([]byte, error) {
	var in msgCompletion
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

// systemMessage reads system (a string or an array of text blocks) as a
// chat system message: a string, or text parts when a block carries a
// breakpoint; nil when there is none.
func systemMessage(raw json.RawMessage) (*oaOutMsg, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var blocks []anInBlock
	if json.Unmarshal(raw, &blocks) != nil {
		text, err := systemText(raw)
		if err != nil || text == "" {
			return nil, err
		}
		return &oaOutMsg{Role: "system", Content: text}, nil
	}
	marked := false
	for _, b := range blocks {
		marked = marked || present(b.CacheControl) != nil
	}
	if !marked {
		text, err := systemText(raw)
		if err != nil || text == "" {
			return nil, err
		}
		return &oaOutMsg{Role: "system", Content: text}, nil
	}
	parts := make([]msgPart, 0, len(blocks))
	for i, b := range blocks {
		if b.Type != "text" {
			return nil, fmt.Errorf("system[%d].type: must be text", i)
		}
		parts = append(parts, msgPart{Type: "text", Text: b.Text, CacheControl: present(b.CacheControl)})
	}
	return &oaOutMsg{Role: "system", Content: parts}, nil
}

// withThinking carries Anthropic's thinking object into the chat body.
// Its budget is output: the Messages API requires it below max_tokens,
// so the max_tokens reserved covers it.
func withThinking(out map[string]any, raw json.RawMessage, maxTokens int) error {
	raw = present(raw)
	if raw == nil {
		return nil
	}
	var th struct {
		Type         string `json:"type"`
		BudgetTokens *int   `json:"budget_tokens"`
	}
	if json.Unmarshal(raw, &th) != nil {
		return errors.New("thinking: must be an object")
	}
	switch th.Type {
	case "disabled":
	case "enabled":
		if th.BudgetTokens == nil {
			return errors.New("thinking.budget_tokens: Field required")
		}
		if *th.BudgetTokens < 1 || *th.BudgetTokens >= maxTokens {
			return fmt.Errorf("thinking.budget_tokens: must be at least 1 and less than max_tokens (%d), got %d", maxTokens, *th.BudgetTokens)
		}
	default:
		return fmt.Errorf("thinking.type: must be enabled or disabled, got %q", clip.String(th.Type, 64))
	}
	out["thinking"] = raw
	return nil
}

// AnthropicErrorType maps an HTTP status to Anthropic's error types.
func AnthropicErrorType(status int) string {
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

// MessageEvents is Anthropic's Messages stream, translated from OpenAI
// chunks as they come: message_start at the first chunk; a text block for
// content, a tool_use block per tool call (its arguments as
// input_json_delta), each opened by content_block_start and closed by
// content_block_stop when the next begins or the message ends; then
// message_delta (stop_reason and usage) and message_stop. Errors are
// event: error with Anthropic's error types; keep-alives are ping events.
// Every event names its type, which Anthropic's SDKs dispatch on.
type MessageEvents struct {
	model   string // the model asked for, until a chunk names one
	started bool
	// open is the index of the open content block (-1: none), next the
	// index the next block gets; tools maps an OpenAI tool call index to
	// its block.
	open, next int
	tools      map[int]int
	openText   bool
	stop       string
	usage      *ChatUsage
}

func NewMessageEvents(model string) *MessageEvents {
	return &MessageEvents{model: model, open: -1, tools: map[int]int{}}
}

// chatChunk is the part of a chat.completion.chunk the translations read.
type chatChunk struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content   *string `json:"content"`
			Refusal   *string `json:"refusal"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *ChatUsage        `json:"usage"`
	Items []json.RawMessage `json:"sluice_items"`
}

func (a *MessageEvents) emit(w io.Writer, typ string, v map[string]any) bool {
	v["type"] = typ
	data, err := json.Marshal(v)
	if err != nil { // only maps of our own values are encoded
		return false
	}
	buf := make([]byte, 0, len(typ)+len(data)+16)
	buf = append(buf, "event: "...)
	buf = append(buf, typ...)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	_, err = w.Write(buf)
	return err == nil
}

// begin writes message_start once.
func (a *MessageEvents) begin(w io.Writer, id string) bool {
	if a.started {
		return true
	}
	a.started = true
	return a.emit(w, "message_start", map[string]any{"message": map[string]any{
		"id": messageID(id), "type": "message", "role": "assistant", "model": a.model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 0, "output_tokens": 0},
	}})
}

// closeBlock writes content_block_stop for the open block, if any.
func (a *MessageEvents) closeBlock(w io.Writer) bool {
	if a.open < 0 {
		return true
	}
	i := a.open
	a.open, a.openText = -1, false
	return a.emit(w, "content_block_stop", map[string]any{"index": i})
}

// openBlock closes the open block and starts block, returning its index.
func (a *MessageEvents) openBlock(w io.Writer, block map[string]any) (int, bool) {
	if !a.closeBlock(w) {
		return 0, false
	}
	i := a.next
	a.next++
	a.open = i
	return i, a.emit(w, "content_block_start", map[string]any{"index": i, "content_block": block})
}

func (a *MessageEvents) Chunk(w io.Writer, c []byte) bool {
	var ch chatChunk
	if json.Unmarshal(c, &ch) != nil {
		return true // not a chunk: nothing a Messages client could read
	}
	if ch.Model != "" {
		a.model = ch.Model
	}
	if !a.begin(w, ch.ID) {
		return false
	}
	if ch.Usage != nil {
		a.usage = ch.Usage
	}
	for _, choice := range ch.Choices {
		if choice.Index != 0 {
			continue // /v1/messages asks for one completion
		}
		d := choice.Delta
		text := ""
		switch {
		case d.Content != nil:
			text = *d.Content
		case d.Refusal != nil:
			text = *d.Refusal
		}
		if text != "" {
			if !a.openText {
				if _, ok := a.openBlock(w, map[string]any{"type": "text", "text": ""}); !ok {
					return false
				}
				a.openText = true
			}
			if !a.emit(w, "content_block_delta", map[string]any{"index": a.open,
				"delta": map[string]any{"type": "text_delta", "text": text}}) {
				return false
			}
		}
		for _, tc := range d.ToolCalls {
			i, seen := a.tools[tc.Index]
			if !seen {
				var ok bool
				i, ok = a.openBlock(w, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Function.Name, "input": map[string]any{}})
				if !ok {
					return false
				}
				a.tools[tc.Index] = i
			}
			if tc.Function.Arguments == "" {
				continue
			}
			// A fragment for a block already closed (OpenAI streams one
			// call's arguments after another, so this is rare) is still
			// sent: the SDKs add a delta to its block by index, and
			// dropping it would lose part of the arguments.
			if !a.emit(w, "content_block_delta", map[string]any{"index": i,
				"delta": map[string]any{"type": "input_json_delta", "partial_json": tc.Function.Arguments}}) {
				return false
			}
		}
		if choice.FinishReason != nil && *choice.FinishReason != "" {
			a.stop = stopReason(*choice.FinishReason)
		}
	}
	return true
}

func (a *MessageEvents) Done(w io.Writer) bool {
	if !a.begin(w, "") || !a.closeBlock(w) {
		return false
	}
	stop := a.stop
	if stop == "" {
		stop = "end_turn"
	}
	usage := map[string]any{"output_tokens": 0}
	if u := a.usage; u != nil {
		in, cached, written := u.split()
		usage = map[string]any{"input_tokens": in, "output_tokens": u.CompletionTokens,
			"cache_read_input_tokens": cached, "cache_creation_input_tokens": written}
	}
	return a.emit(w, "message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": usage}) &&
		a.emit(w, "message_stop", map[string]any{})
}

func (a *MessageEvents) Fail(w io.Writer, msg string, status int, rid string) bool {
	ev := map[string]any{"error": map[string]any{"type": AnthropicErrorType(status), "message": msg}}
	if rid != "" {
		ev["request_id"] = rid // as Anthropic's error bodies carry it
	}
	return a.emit(w, "error", ev)
}

func (a *MessageEvents) KeepAlive(w io.Writer) bool {
	return a.emit(w, "ping", map[string]any{})
}
