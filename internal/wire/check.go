package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	jsonv1 "github.com/go-json-experiment/json/v1"

	"github.com/sluice-dev/sluice/pkg/clip"

	"github.com/sluice-dev/sluice/pkg/job"
)

// The Chat Completions request schema, as Sluice checks a body before it
// spends any budget on it: what the provider would refuse as malformed
// (an unknown role or field, a message without its content, a sampling
// value out of range) is refused here with a 400, not forwarded and paid
// for. The tables follow OpenAI's API reference; cache_control and
// thinking are Sluice's own (carried to an Anthropic provider, and written
// by the /v1/messages translation).

// chatFields are the members of a chat completions request.
var chatFields = []string{"model", "messages", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
	"logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
	"presence_penalty", "prompt_cache_key", "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier",
	"seed", "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools", "top_logprobs",
	"top_p", "user", "verbosity", "web_search_options", "thinking"}

// chatRole is what a message of one role may hold, and what it must.
type chatRole struct {
	fields []string
	// content: the message must have content (assistant: content,
	// tool_calls or function_call).
	content bool
	// toolCallID: the message must name the call it answers.
	toolCallID bool
}

var chatRoles = map[string]chatRole{
	"system":    {fields: []string{"role", "content", "name", "cache_control"}, content: true},
	"developer": {fields: []string{"role", "content", "name", "cache_control"}, content: true},
	"user":      {fields: []string{"role", "content", "name", "cache_control"}, content: true},
	"assistant": {fields: []string{"role", "content", "name", "tool_calls", "function_call", "refusal", "audio", "cache_control"}},
	"tool":      {fields: []string{"role", "content", "tool_call_id", "cache_control"}, content: true, toolCallID: true},
	"function":  {fields: []string{"role", "content", "name"}, content: true},
}

// chatRoleNames lists chatRoles' keys in the order an error names them.
var chatRoleNames = []string{"system", "developer", "user", "assistant", "tool", "function"}

// numRange is a sampling parameter's allowed range.
type numRange struct {
	field    string
	min, max float64
	integer  bool
}

var chatRanges = []numRange{
	{field: "temperature", min: 0, max: 2},
	{field: "top_p", min: 0, max: 1},
	{field: "frequency_penalty", min: -2, max: 2},
	{field: "presence_penalty", min: -2, max: 2},
	{field: "n", min: 1, max: 128, integer: true},
	{field: "top_logprobs", min: 0, max: 20, integer: true},
}

// CheckChat refuses a chat completions body the provider would refuse as
// malformed, and returns the body's top-level members (as json.Unmarshal
// reads the body into a map) for its caller to read without decoding the
// body again. allowed says whether a field name unknown to the schema is
// let through (the model's allow_fields: a provider's own extension); it
// may be nil. Errors are *job.ValidationError naming the field as
// request.<path> and never quote content beyond a clipped name.
//
// Every job's body is checked here, so it is decoded by the v1 API of
// go-json-experiment/json: encoding/json's semantics (FuzzCheckChat holds
// CheckChat to the same answers decoded by encoding/json), each value
// scanned once rather than validated then decoded.
func CheckChat(body []byte, allowed func(name string) bool) (map[string]json.RawMessage, error) {
	return checkChat(body, allowed, jsonv1.Unmarshal)
}

func checkChat(body []byte, allowed func(name string) bool, unmarshal func([]byte, any) error) (map[string]json.RawMessage, error) {
	if allowed == nil {
		allowed = func(string) bool { return false }
	}
	var top map[string]json.RawMessage
	if unmarshal(body, &top) != nil {
		return nil, invalid("request", "must be a JSON object")
	}
	if err := unknownField("", top, chatFields, allowed, "a chat completions field"); err != nil {
		return nil, err
	}
	if err := checkRanges(top, chatRanges, "", unmarshal); err != nil {
		return nil, err
	}
	var msgs []json.RawMessage
	if unmarshal(top["messages"], &msgs) != nil {
		return top, nil // the token estimate refuses it, with its own words
	}
	for i, raw := range msgs {
		if err := checkChatMessage(fmt.Sprintf("messages[%d]", i), raw, allowed, unmarshal); err != nil {
			return nil, err
		}
	}
	return top, nil
}

func checkChatMessage(at string, raw json.RawMessage, allowed func(string) bool, unmarshal func([]byte, any) error) error {
	var m map[string]json.RawMessage
	if unmarshal(raw, &m) != nil {
		return invalid("request."+at, "must be an object")
	}
	var role string
	if unmarshal(m["role"], &role) != nil || role == "" {
		return invalid("request."+at+".role", "is required: one of "+strings.Join(chatRoleNames, ", "))
	}
	spec, ok := chatRoles[role]
	if !ok {
		return invalid("request."+at+".role", fmt.Sprintf("must be one of %s, got %q", strings.Join(chatRoleNames, ", "), clip.String(role, 64)))
	}
	if err := unknownField(at+".", m, spec.fields, allowed, "a field of a "+role+" message"); err != nil {
		return err
	}
	switch {
	case spec.content && present(m["content"]) == nil:
		return invalid("request."+at+".content", "is required in a "+role+" message")
	case role == "assistant" && present(m["content"]) == nil && present(m["tool_calls"]) == nil && present(m["function_call"]) == nil:
		return invalid("request."+at+".content", "is required in an assistant message without tool_calls")
	}
	if spec.toolCallID {
		var id string
		if unmarshal(m["tool_call_id"], &id) != nil || id == "" {
			return invalid("request."+at+".tool_call_id", "is required in a tool message: it names the tool call the message answers")
		}
	}
	return nil
}

// unknownField refuses the first member of obj (by name) that known does
// not hold and allowed does not let through.
func unknownField(prefix string, obj map[string]json.RawMessage, known []string, allowed func(string) bool, what string) error {
	var names []string
	for name := range obj {
		if !slices.Contains(known, name) && !allowed(name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	msg := "is not " + what
	if near := nearest(names[0], known); near != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", near)
	}
	msg += "; a provider's own field passes when the model's allow_fields names it"
	return invalid("request."+prefix+clip.String(names[0], 64), msg)
}

// checkRanges refuses a number out of its range (null counts as absent).
func checkRanges(obj map[string]json.RawMessage, ranges []numRange, prefix string, unmarshal func([]byte, any) error) error {
	for _, r := range ranges {
		raw := present(obj[r.field])
		if raw == nil {
			continue
		}
		var v float64
		if unmarshal(raw, &v) != nil {
			return invalid("request."+prefix+r.field, "must be a number")
		}
		if r.integer && v != float64(int64(v)) {
			return invalid("request."+prefix+r.field, "must be an integer")
		}
		if v < r.min || v > r.max {
			return invalid("request."+prefix+r.field, fmt.Sprintf("must be between %g and %g, got %s", r.min, r.max, clip.String(string(bytes.TrimSpace(raw)), 64)))
		}
	}
	return nil
}

func invalid(field, msg string) error {
	return &job.ValidationError{Code: job.CodeInvalidRequest, Field: field, Message: msg}
}

// nearest is the name in known at most two edits from name ("": none).
func nearest(name string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if d := editDistance(name, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance (with transpositions counted as
// two edits) between short ASCII names.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
