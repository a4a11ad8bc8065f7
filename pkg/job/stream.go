package job

import (
	"bytes"
	"encoding/json"
	"sort"
	"strings"
)

// Streaming subjects.
const (
	// StreamPrefix: sluice.stream.<tenant>.<job_id> carries a streamed
	// job's chunks (StreamMessage), captured by the STREAMS memory stream
	// so a reader that joins late replays them from the start.
	StreamPrefix = "sluice.stream."
	// CancelPrefix: sluice.cancel.<tenant>.<job_id> asks the executor
	// running the job to stop its provider call.
	CancelPrefix = "sluice.cancel."
)

// StreamSubject is where a streamed job's chunks are published.
func StreamSubject(tenant, jobID string) string { return StreamPrefix + tenant + "." + jobID }

// CancelSubject is where a job's cancellation is asked for.
func CancelSubject(tenant, jobID string) string { return CancelPrefix + tenant + "." + jobID }

// StreamMessage is one message on a job's stream subject: the chunks
// received since the previous message (batched by time), in order. The
// last message of a stream has End set to the job's terminal status
// (succeeded, interrupted, cancelled, failed...) and, unless it succeeded,
// Error.
type StreamMessage struct {
	// Chunks are OpenAI chat.completion.chunk objects, as the client asked
	// for them (the usage chunk only with stream_options.include_usage).
	Chunks []json.RawMessage `json:"chunks,omitempty"`
	End    Status            `json:"end,omitempty"`
	Error  *Error            `json:"error,omitempty"`
}

// Chunk is an OpenAI chat.completion.chunk, the fields Sluice reads.
type Chunk struct {
	ID                string        `json:"id"`
	Object            string        `json:"object"`
	Created           int64         `json:"created"`
	Model             string        `json:"model"`
	SystemFingerprint string        `json:"system_fingerprint,omitempty"`
	Choices           []ChunkChoice `json:"choices"`
	Usage             *ChunkUsage   `json:"usage,omitempty"`
	// Items are provider output items chat has no form for (ItemsMember).
	Items []json.RawMessage `json:"sluice_items,omitempty"`
}

// ItemsMember is the member of a chat.completion (or chunk) carrying, in
// order, the output items a provider serving the Responses API natively
// returned that chat has no form for (reasoning, built-in tool calls),
// verbatim. Only jobs that came in on /v1/responses carry it.
const ItemsMember = "sluice_items"

// ChunkChoice is one choice's delta.
type ChunkChoice struct {
	Index        int        `json:"index"`
	Delta        ChunkDelta `json:"delta"`
	FinishReason *string    `json:"finish_reason"`
}

// ChunkDelta is what a chunk adds to the message.
type ChunkDelta struct {
	Role      string          `json:"role,omitempty"`
	Content   *string         `json:"content,omitempty"`
	Refusal   *string         `json:"refusal,omitempty"`
	ToolCalls []ToolCallDelta `json:"tool_calls,omitempty"`
}

// ToolCallDelta is a piece of a tool call: the first names it, the rest
// add to its arguments.
type ToolCallDelta struct {
	Index    int    `json:"index"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments,omitempty"`
	} `json:"function"`
}

// ChunkUsage is the usage chunk's usage, in OpenAI's shape.
type ChunkUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details,omitempty"`
	// CacheCreationInputTokens is what an Anthropic provider wrote to its
	// cache (part of PromptTokens).
	CacheCreationInputTokens int `json:"cache_creation_input_tokens,omitempty"`
}

// Usage converts to Sluice's usage, clamping negative counts to 0.
func (u *ChunkUsage) Usage() Usage {
	out := Usage{PromptTokens: max(u.PromptTokens, 0), CompletionTokens: max(u.CompletionTokens, 0)}
	if u.PromptTokensDetails != nil {
		out.CachedTokens = max(u.PromptTokensDetails.CachedTokens, 0)
	}
	// Written to the cache: within the prompt not read from it, as a
	// non-streamed answer's usage is read (provider.ParseUsage).
	out.CacheWriteTokens = max(min(u.CacheCreationInputTokens, out.PromptTokens-out.CachedTokens), 0)
	if u.CompletionTokensDetails != nil {
		out.ReasoningTokens = max(u.CompletionTokensDetails.ReasoningTokens, 0)
		out.CompletionTokens = max(out.CompletionTokens, out.ReasoningTokens) // output, whatever the provider's total says
	}
	out.TotalTokens = out.PromptTokens + out.CompletionTokens
	return out
}

// Text is the content the chunk adds (all choices).
func (c *Chunk) Text() string {
	var b strings.Builder
	for _, ch := range c.Choices {
		if ch.Delta.Content != nil {
			b.WriteString(*ch.Delta.Content)
		}
	}
	return b.String()
}

// HasOutput reports whether the chunk carries output the caller sees:
// content, a refusal or a tool call. The first such chunk is the stream's
// first token.
func (c *Chunk) HasOutput() bool {
	for _, ch := range c.Choices {
		d := ch.Delta
		if (d.Content != nil && *d.Content != "") || (d.Refusal != nil && *d.Refusal != "") || len(d.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

// UsageOnly reports whether the chunk is the usage chunk (usage and no
// choices), which is sent only to callers that asked for it.
func (c *Chunk) UsageOnly() bool { return c.Usage != nil && len(c.Choices) == 0 }

// Transcript assembles a streamed answer from its chunks into the
// chat.completion a non-streamed call would have returned.
type Transcript struct {
	id, model, fingerprint string
	created                int64
	role                   string
	content, refusal       strings.Builder
	hasContent, hasRefusal bool
	tools                  map[int]*toolCall
	finish                 string
	usage                  *Usage
	output                 bool
	items                  []json.RawMessage
}

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// Add folds a chunk in (choice 0 only: Sluice accepts n=1).
func (t *Transcript) Add(c *Chunk) {
	if t.id == "" {
		t.id, t.model, t.created, t.fingerprint = c.ID, c.Model, c.Created, c.SystemFingerprint
	}
	if c.Usage != nil {
		u := c.Usage.Usage()
		t.usage = &u
	}
	if c.HasOutput() {
		t.output = true
	}
	t.items = append(t.items, c.Items...)
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		d := ch.Delta
		if d.Role != "" {
			t.role = d.Role
		}
		if d.Content != nil {
			t.content.WriteString(*d.Content)
			t.hasContent = true
		}
		if d.Refusal != nil {
			t.refusal.WriteString(*d.Refusal)
			t.hasRefusal = true
		}
		for _, tc := range d.ToolCalls {
			if t.tools == nil {
				t.tools = map[int]*toolCall{}
			}
			cur := t.tools[tc.Index]
			if cur == nil {
				cur = &toolCall{Type: "function"}
				t.tools[tc.Index] = cur
			}
			if tc.ID != "" {
				cur.ID = tc.ID
			}
			if tc.Type != "" {
				cur.Type = tc.Type
			}
			cur.Function.Name += tc.Function.Name
			cur.Function.Arguments += tc.Function.Arguments
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			t.finish = *ch.FinishReason
		}
	}
}

// Started reports whether any output reached the transcript: after it, a
// failed stream cannot be retried without repeating what the caller saw.
func (t *Transcript) Started() bool { return t.output }

// Text is the content received so far.
func (t *Transcript) Text() string { return t.content.String() }

// Usage is the usage the provider reported, or nil.
func (t *Transcript) Usage() *Usage { return t.usage }

// Completion renders what was received as an OpenAI chat.completion. A
// stream that did not finish has finish_reason null.
func (t *Transcript) Completion() json.RawMessage {
	role := t.role
	if role == "" {
		role = "assistant"
	}
	msg := map[string]any{"role": role, "content": nil}
	if t.hasContent || len(t.tools) == 0 {
		msg["content"] = t.content.String()
	}
	if t.hasRefusal {
		msg["refusal"] = t.refusal.String()
	}
	if len(t.tools) > 0 {
		idx := make([]int, 0, len(t.tools))
		for i := range t.tools {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		calls := make([]*toolCall, 0, len(idx))
		for _, i := range idx {
			calls = append(calls, t.tools[i])
		}
		msg["tool_calls"] = calls
	}
	var finish any
	if t.finish != "" {
		finish = t.finish
	}
	out := map[string]any{
		"id": t.id, "object": "chat.completion", "created": t.created, "model": t.model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "logprobs": nil, "finish_reason": finish}},
	}
	if t.fingerprint != "" {
		out["system_fingerprint"] = t.fingerprint
	}
	if len(t.items) > 0 {
		out[ItemsMember] = t.items
	}
	if t.usage != nil {
		out["usage"] = map[string]any{"prompt_tokens": t.usage.PromptTokens, "completion_tokens": t.usage.CompletionTokens,
			"total_tokens": t.usage.TotalTokens, "prompt_tokens_details": map[string]int{"cached_tokens": t.usage.CachedTokens}}
	}
	data, _ := json.Marshal(out)
	return data
}

// CompletionChunks renders a chat.completion body as the chunks a streamed
// call would have sent: a role chunk, one content chunk, the tool calls,
// a finish chunk and, with usage, the usage chunk. Relays use it for a job
// whose answer was not streamed (a submission that joined a non-streamed
// job with the same idempotency key). It returns nil for a body it cannot
// read.
func CompletionChunks(body []byte, usage bool) []json.RawMessage {
	var c struct {
		ID                string `json:"id"`
		Created           int64  `json:"created"`
		Model             string `json:"model"`
		SystemFingerprint string `json:"system_fingerprint"`
		Choices           []struct {
			Index   int `json:"index"`
			Message struct {
				Role      string          `json:"role"`
				Content   *string         `json:"content"`
				Refusal   *string         `json:"refusal"`
				ToolCalls json.RawMessage `json:"tool_calls"`
			} `json:"message"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage json.RawMessage   `json:"usage"`
		Items []json.RawMessage `json:"sluice_items"`
	}
	if json.Unmarshal(body, &c) != nil {
		return nil
	}
	var out []json.RawMessage
	add := func(choices any, u json.RawMessage) {
		m := map[string]any{"id": c.ID, "object": "chat.completion.chunk", "created": c.Created, "model": c.Model, "choices": choices}
		if c.SystemFingerprint != "" {
			m["system_fingerprint"] = c.SystemFingerprint
		}
		if u != nil {
			m["usage"] = u
		}
		data, _ := json.Marshal(m)
		out = append(out, data)
	}
	for _, ch := range c.Choices {
		role := ch.Message.Role
		if role == "" {
			role = "assistant"
		}
		add([]any{map[string]any{"index": ch.Index, "delta": map[string]any{"role": role, "content": ""}, "logprobs": nil, "finish_reason": nil}}, nil)
		if len(c.Items) > 0 && ch.Index == 0 {
			m := map[string]any{"id": c.ID, "object": "chat.completion.chunk", "created": c.Created, "model": c.Model, "choices": []any{}, ItemsMember: c.Items}
			data, _ := json.Marshal(m)
			out = append(out, data)
		}
		if ch.Message.Content != nil && *ch.Message.Content != "" {
			add([]any{map[string]any{"index": ch.Index, "delta": map[string]any{"content": *ch.Message.Content}, "logprobs": nil, "finish_reason": nil}}, nil)
		}
		if ch.Message.Refusal != nil && *ch.Message.Refusal != "" {
			add([]any{map[string]any{"index": ch.Index, "delta": map[string]any{"refusal": *ch.Message.Refusal}, "logprobs": nil, "finish_reason": nil}}, nil)
		}
		if tc := bytes.TrimSpace(ch.Message.ToolCalls); len(tc) > 0 && tc[0] == '[' {
			var calls []map[string]any
			if json.Unmarshal(tc, &calls) == nil {
				for i, call := range calls {
					call["index"] = i
				}
				add([]any{map[string]any{"index": ch.Index, "delta": map[string]any{"tool_calls": calls}, "logprobs": nil, "finish_reason": nil}}, nil)
			}
		}
		add([]any{map[string]any{"index": ch.Index, "delta": map[string]any{}, "logprobs": nil, "finish_reason": ch.FinishReason}}, nil)
	}
	if usage && len(c.Usage) > 0 && string(c.Usage) != "null" {
		add([]any{}, c.Usage)
	}
	return out
}

// WithoutMembers returns the JSON object body without its top-level
// members named keys, every other byte as it was (so a body and the same
// body with a member added and removed hash alike). A body that is not an
// object, or holds none of keys, is returned as it is.
func WithoutMembers(body []byte, keys ...string) []byte {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return body
	}
	type member struct {
		start, end int64
		drop       bool
	}
	var members []member
	prev := dec.InputOffset()
	dropped := false
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return body
		}
		key, _ := kt.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return body
		}
		end := dec.InputOffset()
		drop := false
		for _, k := range keys {
			drop = drop || k == key
		}
		dropped = dropped || drop
		members = append(members, member{prev, end, drop})
		prev = end
	}
	if !dropped {
		return body
	}
	out := make([]byte, 0, len(body))
	out = append(out, '{')
	n := 0
	for _, m := range members {
		if m.drop {
			continue
		}
		raw := bytes.TrimLeft(body[m.start:m.end], " \t\r\n")
		raw = bytes.TrimLeft(bytes.TrimPrefix(raw, []byte(",")), " \t\r\n")
		if n > 0 {
			out = append(out, ',')
		}
		out = append(out, raw...)
		n++
	}
	return append(out, '}')
}

// WithMember returns the JSON object body with its top-level member key
// set to the JSON value raw: an existing member is removed and the new one
// appended last, every other byte as it was. A body that is not an object
// is returned as it is.
func WithMember(body []byte, key string, raw json.RawMessage) []byte {
	b := bytes.TrimRight(WithoutMembers(body, key), " \t\r\n")
	if len(b) == 0 || b[len(b)-1] != '}' {
		return body
	}
	name, _ := json.Marshal(key)
	out := make([]byte, 0, len(b)+len(name)+len(raw)+2)
	out = append(out, b[:len(b)-1]...)
	if !bytes.Equal(bytes.TrimSpace(b[:len(b)-1]), []byte("{")) {
		out = append(out, ',')
	}
	out = append(out, name...)
	out = append(out, ':')
	out = append(out, raw...)
	return append(out, '}')
}
