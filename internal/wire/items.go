package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// What a Responses request holds that chat has no form for (reasoning
// items, built-in tools and their calls, include) reaches a provider
// serving the Responses API natively unchanged: the chat body carries it
// in its NativeMember, which ChatToResponses reads and every translation
// to another API removes (ForChat). Its answer's items chat cannot carry
// come back in job.ItemsMember, so a Response lists them in order.

// NativeMember is the chat body member carrying a Native. Its name is
// reserved (job.ReservedPrefix): only the /v1/responses handler writes
// it, and a producer's body naming it is refused.
const NativeMember = job.ReservedPrefix + "responses"

// Native is the part of a Responses request sent as it is to a provider
// serving the Responses API: the whole conversation's input items (the
// history a previous response holds, then this request's), and the
// request's tools, tool_choice, include and reasoning.
type Native struct {
	Instructions *string           `json:"instructions,omitempty"`
	Input        []json.RawMessage `json:"input"`
	Tools        []json.RawMessage `json:"tools,omitempty"`
	ToolChoice   json.RawMessage   `json:"tool_choice,omitempty"`
	Include      []string          `json:"include,omitempty"`
	Reasoning    json.RawMessage   `json:"reasoning,omitempty"`
}

// chatItem reports whether an item type has a chat form.
func chatItem(typ string) bool {
	switch typ {
	case "", "message", "function_call", "function_call_output":
		return true
	}
	return false
}

// itemType is an item's type ("message" for an easy message).
func itemType(raw json.RawMessage) string {
	var it struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &it)
	if it.Type == "" {
		return "message"
	}
	return it.Type
}

// Items is the request's input as a list of items: a string input is
// one user message.
func (r *Request) Items() ([]json.RawMessage, error) {
	in := bytes.TrimSpace(r.Input)
	var s string
	if json.Unmarshal(in, &s) == nil {
		b, _ := marshal(map[string]any{"type": "message", "role": "user", "content": s})
		return []json.RawMessage{b}, nil
	}
	var items []json.RawMessage
	if json.Unmarshal(in, &items) != nil {
		return nil, errf("input", "must be a string or a list of items")
	}
	for i, it := range items {
		var probe struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(it, &probe) != nil {
			return nil, errf(fmt.Sprintf("input[%d]", i), "must be an object")
		}
	}
	return items, nil
}

// ChatMessages translates this request's input items to chat messages.
// Reasoning items are dropped (no chat provider reads them); another
// item type chat has no form for is refused, unless native: then it
// travels in the Native member and only the chat form skips it.
func ChatMessages(items []json.RawMessage, native bool) ([]ChatMessage, error) {
	return chatMessages(items, func(i int, typ string) error {
		switch {
		case typ == "reasoning":
			return nil
		case typ == "item_reference":
			return errf(fmt.Sprintf("input[%d].type", i), "item_reference is not supported through Sluice: it calls providers with store false, so there is no stored item to refer to; send the item itself")
		case native:
			return nil
		}
		return errf(fmt.Sprintf("input[%d].type", i), "item type %q is not supported on this model: it is translated to another API (only a provider with responses: native takes it)", clip.String(typ, 64))
	})
}

// HistoryMessages translates a stored conversation to chat messages,
// skipping the items chat has no form for.
func HistoryMessages(items []json.RawMessage) []ChatMessage {
	out, _ := chatMessages(items, func(int, string) error { return nil })
	return out
}

func chatMessages(raws []json.RawMessage, other func(i int, typ string) error) ([]ChatMessage, error) {
	var out []ChatMessage
	for i, raw := range raws {
		var it item
		if json.Unmarshal(raw, &it) != nil {
			return nil, errf(fmt.Sprintf("input[%d]", i), "has a field of the wrong type")
		}
		param := fmt.Sprintf("input[%d]", i)
		switch it.Type {
		case "", "message":
			m, err := messageItem(param, it)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		case "function_call":
			if it.CallID == "" || it.Name == "" {
				return nil, errf(param, "a function_call needs call_id and name")
			}
			tc := ChatToolCall{ID: it.CallID, Type: "function"}
			tc.Function.Name, tc.Function.Arguments = it.Name, it.Arguments
			if n := len(out); n > 0 && out[n-1].Role == "assistant" {
				out[n-1].ToolCalls = append(out[n-1].ToolCalls, tc)
				continue
			}
			out = append(out, ChatMessage{Role: "assistant", Content: nil, ToolCalls: []ChatToolCall{tc}})
		case "function_call_output":
			if it.CallID == "" {
				return nil, errf(param+".call_id", "is required")
			}
			text, err := outputText(it.Output)
			if err != nil {
				return nil, errf(param+".output", "%s", err.Msg)
			}
			out = append(out, ChatMessage{Role: "tool", ToolCallID: it.CallID, Content: text})
		default:
			if err := other(i, it.Type); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// BuiltinTools lists the request's tools that are not function tools, as
// "tools[i]" with the tool's type.
func (r *Request) BuiltinTools() (params, types []string) {
	for i, t := range r.Tools {
		if typ := toolType(t); typ != "function" {
			params, types = append(params, fmt.Sprintf("tools[%d].type", i)), append(types, typ)
		}
	}
	return params, types
}

func toolType(raw json.RawMessage) string {
	var t struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &t)
	return t.Type
}

// BuiltinChoice reports whether tool_choice picks a built-in tool.
func (r *Request) BuiltinChoice() bool { return builtinChoice(present(r.ToolChoice)) }

// builtinChoice reports whether tool_choice picks a built-in tool.
func builtinChoice(raw json.RawMessage) bool {
	var f struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(raw, &f) == nil && f.Type != "" && f.Type != "function"
}

// UpstreamHistory is a stored conversation as a provider serving the
// Responses API is sent it: the ids of messages and function calls,
// which are Sluice's, are removed, and reasoning items go as
// UpstreamInput sends them. Every other item goes as it was.
func UpstreamHistory(items []json.RawMessage) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(items))
	for _, raw := range UpstreamInput(items) {
		if chatItem(itemType(raw)) {
			raw = job.WithoutMembers(raw, "id")
		}
		out = append(out, raw)
	}
	return out
}

// UpstreamInput is a request's input items as a provider serving the
// Responses API is sent them: as they are, but for a reasoning item
// without its encrypted_content, which is left out. Such an item names
// reasoning the provider kept, and Sluice calls it with store false, so
// there is none: the provider would refuse the call ("Item with id
// 'rs_...' not found"). Reasoning carries over in its encrypted_content
// (include: ["reasoning.encrypted_content"]).
func UpstreamInput(items []json.RawMessage) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(items))
	for _, raw := range items {
		if itemType(raw) == "reasoning" {
			var r struct {
				Encrypted string `json:"encrypted_content"`
			}
			if json.Unmarshal(raw, &r) != nil || r.Encrypted == "" {
				continue
			}
		}
		out = append(out, raw)
	}
	return out
}

// Native is what a provider serving the Responses API natively needs
// beyond the chat body for this request over conversation (the history
// as UpstreamHistory gives it, then this request's items), or nil when
// the chat body says it all.
func (r *Request) Native(conversation []json.RawMessage) *Native {
	need := len(r.Include) > 0 || builtinChoice(present(r.ToolChoice))
	for _, it := range conversation {
		need = need || !chatItem(itemType(it))
	}
	if params, _ := r.BuiltinTools(); len(params) > 0 {
		need = true
	}
	var reasoning map[string]json.RawMessage
	if json.Unmarshal(present(r.Reasoning), &reasoning) == nil {
		for k := range reasoning {
			need = need || k != "effort"
		}
	}
	if !need {
		return nil
	}
	return &Native{Instructions: r.Instructions, Input: conversation, Tools: r.Tools, ToolChoice: present(r.ToolChoice), Include: r.Include,
		Reasoning: present(r.Reasoning)}
}

// ForChat is a Responses job's chat body as a provider called on another
// API is sent it: without the Native member. Built-in tools cannot be
// translated, and are refused by name; reasoning items are dropped.
func ForChat(body []byte) ([]byte, error) {
	var probe struct {
		Native *Native `json:"sluice_responses"`
	}
	if json.Unmarshal(body, &probe) != nil || probe.Native == nil {
		return body, nil
	}
	for _, t := range probe.Native.Tools {
		if typ := toolType(t); typ != "function" {
			return nil, fmt.Errorf("built-in tool %q runs only on a provider serving the Responses API natively (responses: native); this one is called on another API", clip.String(typ, 64))
		}
	}
	return job.WithoutMembers(body, NativeMember), nil
}

// errNotItems: a stored conversation that is not a list of items.
var errNotItems = errors.New("not a list of items")

// ListItem is a conversation item as GET /v1/responses/{id}/input_items
// lists it: with an id (index is its place in the conversation, which
// with the item's bytes makes an id stable along the chain), a message's
// string content as one text part, and a status.
func ListItem(raw json.RawMessage, index int) (map[string]any, error) {
	var it map[string]any
	if json.Unmarshal(raw, &it) != nil || it == nil {
		return nil, errNotItems
	}
	typ, _ := it["type"].(string)
	if typ == "" {
		typ = "message"
		it["type"] = typ
	}
	if id, _ := it["id"].(string); id == "" {
		prefix := map[string]string{"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}[typ]
		if prefix == "" {
			prefix = "item"
		}
		h := sha256.Sum256(append([]byte(strconv.Itoa(index)+":"), raw...))
		it["id"] = prefix + "_" + hex.EncodeToString(h[:12])
	}
	if typ == "message" {
		if s, ok := it["content"].(string); ok {
			part := "input_text"
			if it["role"] == "assistant" {
				part = "output_text"
			}
			it["content"] = []any{map[string]any{"type": part, "text": s}}
		}
	}
	if _, ok := it["status"]; !ok && (typ == "message" || typ == "function_call" || typ == "function_call_output") {
		it["status"] = StatusCompleted
	}
	return it, nil
}

// ChatHistoryItems translates chat messages (a conversation kept before
// Sluice kept items) to input items.
func ChatHistoryItems(msgs []ChatMessage) []json.RawMessage {
	b, err := json.Marshal(msgs)
	if err != nil {
		return nil
	}
	var in []chatIn
	if json.Unmarshal(b, &in) != nil {
		return nil
	}
	instructions, items, err := responsesInput(in)
	if err != nil {
		return nil
	}
	var out []json.RawMessage
	if instructions != "" {
		m, _ := marshal(map[string]any{"type": "message", "role": "system", "content": instructions})
		out = append(out, m)
	}
	for _, it := range items {
		m, _ := marshal(it)
		out = append(out, m)
	}
	return out
}
