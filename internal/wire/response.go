package wire

import (
	"encoding/json"
	"errors"
	"strings"
)

// Meta is what a Response echoes of its request; Sluice keeps it with a
// stored response's input.
type Meta struct {
	ID                 string            `json:"id"`
	CreatedAt          int64             `json:"created_at"`
	Model              string            `json:"model"`
	Instructions       *string           `json:"instructions,omitempty"`
	Tools              []json.RawMessage `json:"tools,omitempty"`
	ToolChoice         json.RawMessage   `json:"tool_choice,omitempty"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls,omitempty"`
	MaxOutputTokens    *int              `json:"max_output_tokens,omitempty"`
	Temperature        *float64          `json:"temperature,omitempty"`
	TopP               *float64          `json:"top_p,omitempty"`
	Text               json.RawMessage   `json:"text,omitempty"`
	Metadata           map[string]string `json:"metadata,omitempty"`
	PreviousResponseID string            `json:"previous_response_id,omitempty"`
	Store              bool              `json:"store"`
	User               string            `json:"user,omitempty"`
}

// Meta is the request's Meta for the response id with its creation time
// (Unix seconds).
func (r *Request) Meta(id string, created int64) Meta {
	return Meta{ID: id, CreatedAt: created, Model: r.Model, Instructions: r.Instructions, Tools: r.Tools, ToolChoice: present(r.ToolChoice),
		ParallelToolCalls: r.ParallelToolCalls, MaxOutputTokens: r.MaxOutputTokens, Temperature: r.Temperature, TopP: r.TopP,
		Text: present(r.Text), Metadata: r.Metadata, PreviousResponseID: r.PreviousResponseID, Store: r.Stored(), User: r.User}
}

// Usage is a Response's usage.
type Usage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// Status values of a Response.
const (
	StatusCompleted  = "completed"
	StatusIncomplete = "incomplete"
	StatusFailed     = "failed"
	StatusInProgress = "in_progress"
	StatusCancelled  = "cancelled"
)

// Incomplete reasons. ReasonInterrupted is Sluice's: a stream that broke
// after its first token (OpenAI's own are max_output_tokens and
// content_filter).
const (
	ReasonMaxOutputTokens = "max_output_tokens"
	ReasonContentFilter   = "content_filter"
	ReasonInterrupted     = "interrupted"
)

// output accumulates a Response's output items in the order they appear.
type output struct {
	base  string // the response id without its prefix, for item ids
	items []map[string]any
	// msg is the index of the message item in items (-1: none yet).
	msg  int
	text strings.Builder
	// calls maps a chat tool-call index to its item's index in items.
	calls map[int]int
	// native marks the provider's own items (job.ItemsMember), which
	// keep their status.
	native map[int]bool
}

func newOutput(respID string) *output {
	return &output{base: strings.TrimPrefix(respID, "resp_"), msg: -1, calls: map[int]int{}, native: map[int]bool{}}
}

func (o *output) messageID() string { return "msg_" + o.base }

// addText appends text to the message item, opening it if need be; it
// reports whether it opened it.
func (o *output) addText(s string) bool {
	opened := false
	if o.msg < 0 {
		o.msg = len(o.items)
		o.items = append(o.items, map[string]any{"type": "message", "id": o.messageID(), "role": "assistant", "status": StatusInProgress, "content": []any{}})
		opened = true
	}
	o.text.WriteString(s)
	return opened
}

// addCall appends to chat tool call i (opening its item when new); it
// reports whether it opened it.
func (o *output) addCall(i int, id, name, args string) bool {
	k, ok := o.calls[i]
	if !ok {
		k = len(o.items)
		o.calls[i] = k
		o.items = append(o.items, map[string]any{"type": "function_call", "id": "fc_" + strings.TrimPrefix(id, "call_"), "call_id": id,
			"name": name, "arguments": "", "status": StatusInProgress})
	}
	it := o.items[k]
	if id != "" && it["call_id"] == "" {
		it["call_id"], it["id"] = id, "fc_"+strings.TrimPrefix(id, "call_")
	}
	if name != "" && it["name"] == "" {
		it["name"] = name
	}
	it["arguments"] = it["arguments"].(string) + args
	return !ok
}

// addNative appends the provider's own items, as they are; it returns
// their indexes in items.
func (o *output) addNative(raws []json.RawMessage) []int {
	var added []int
	for _, raw := range raws {
		var it map[string]any
		if json.Unmarshal(raw, &it) != nil || it == nil {
			continue
		}
		o.native[len(o.items)] = true
		added = append(added, len(o.items))
		o.items = append(o.items, it)
	}
	return added
}

// finish sets every item's status and the message's text; it returns the
// items.
func (o *output) finish(status string) []map[string]any {
	for i, it := range o.items {
		if !o.native[i] {
			it["status"] = status
		}
	}
	if o.msg >= 0 {
		o.items[o.msg]["content"] = []any{textPart(o.text.String())}
	}
	return o.items
}

func textPart(s string) map[string]any {
	return map[string]any{"type": "output_text", "text": s, "annotations": []any{}, "logprobs": []any{}}
}

// Response builds a Response object.
func Response(m Meta, status string, items []map[string]any, u *Usage, incomplete string, failure *Failure) map[string]any {
	if items == nil {
		items = []map[string]any{}
	}
	r := map[string]any{
		"id": m.ID, "object": "response", "created_at": m.CreatedAt, "status": status, "model": m.Model,
		"output": items, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{}, "store": m.Store,
		"metadata": map[string]string{}, "truncation": "disabled", "text": map[string]any{"format": map[string]any{"type": "text"}},
		"error": nil, "incomplete_details": nil, "instructions": nil, "max_output_tokens": nil, "previous_response_id": nil,
		"temperature": nil, "top_p": nil, "usage": nil, "user": nil,
	}
	if m.Instructions != nil {
		r["instructions"] = *m.Instructions
	}
	if len(m.Tools) > 0 {
		r["tools"] = m.Tools
	}
	if m.ToolChoice != nil {
		r["tool_choice"] = m.ToolChoice
	}
	if m.ParallelToolCalls != nil {
		r["parallel_tool_calls"] = *m.ParallelToolCalls
	}
	if m.MaxOutputTokens != nil {
		r["max_output_tokens"] = *m.MaxOutputTokens
	}
	if m.Temperature != nil {
		r["temperature"] = *m.Temperature
	}
	if m.TopP != nil {
		r["top_p"] = *m.TopP
	}
	if m.Text != nil {
		r["text"] = m.Text
	}
	if m.Metadata != nil {
		r["metadata"] = m.Metadata
	}
	if m.PreviousResponseID != "" {
		r["previous_response_id"] = m.PreviousResponseID
	}
	if m.User != "" {
		r["user"] = m.User
	}
	if u != nil {
		r["usage"] = u
	}
	if incomplete != "" {
		r["incomplete_details"] = map[string]any{"reason": incomplete}
	}
	if failure != nil {
		r["error"] = map[string]any{"code": failure.Code, "message": failure.Message}
	}
	return r
}

// Failure is a failed Response's error.
type Failure struct {
	Code    string
	Message string
}

// chatCompletion is the part of a chat.completion the translation reads.
type chatCompletion struct {
	Choices []struct {
		Message      chatReply `json:"message"`
		FinishReason *string   `json:"finish_reason"`
	} `json:"choices"`
	Usage *ChatUsage        `json:"usage"`
	Items []json.RawMessage `json:"sluice_items"`
}

var errNotCompletion = errors.New("not a chat.completion")

// FromChat builds the Response for a chat.completion answer.
func FromChat(m Meta, completion []byte) (map[string]any, error) {
	var c chatCompletion
	if json.Unmarshal(completion, &c) != nil || len(c.Choices) == 0 {
		return nil, errNotCompletion
	}
	ch := c.Choices[0]
	o := newOutput(m.ID)
	o.addNative(c.Items)
	switch {
	case ch.Message.Content != nil && *ch.Message.Content != "":
		o.addText(*ch.Message.Content)
	case ch.Message.Refusal != nil && *ch.Message.Refusal != "":
		o.addText(*ch.Message.Refusal)
	}
	for i, tc := range ch.Message.ToolCalls {
		o.addCall(i, tc.ID, tc.Function.Name, tc.Function.Arguments)
	}
	finish := ""
	if ch.FinishReason != nil {
		finish = *ch.FinishReason
	}
	status, reason := statusOf(finish)
	return Response(m, status, o.finish(itemStatus(status)), c.Usage.responses(), reason, nil), nil
}

// statusOf maps a chat finish_reason to a Response status and incomplete
// reason.
func statusOf(finish string) (status, reason string) {
	switch finish {
	case "length":
		return StatusIncomplete, ReasonMaxOutputTokens
	case "content_filter":
		return StatusIncomplete, ReasonContentFilter
	}
	return StatusCompleted, ""
}

// itemStatus is the status of a response's items.
func itemStatus(status string) string {
	if status == StatusCompleted {
		return StatusCompleted
	}
	return StatusIncomplete
}
