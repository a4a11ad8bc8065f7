package wire_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/job"
)

// TestCheckChat: each body the provider would refuse as malformed is
// refused naming the field, and the bodies the official SDKs send pass.
func TestCheckChat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body string
		field      string // "": passes
		msg        string // a fragment of the message
	}{
		{"plain", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "", ""},
		{"sdk full", `{"model":"m","messages":[{"role":"developer","content":"be brief"},{"role":"system","content":[{"type":"text","text":"s"}]},{"role":"user","name":"ann","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"},{"role":"assistant","content":"ok","refusal":null}],"temperature":0,"top_p":1,"n":1,"presence_penalty":-2,"frequency_penalty":2,"max_completion_tokens":10,"stream":true,"stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required","response_format":{"type":"json_object"},"seed":1,"logprobs":true,"top_logprobs":20,"user":"u","stop":["x"],"parallel_tool_calls":false,"reasoning_effort":"low","prompt_cache_key":"k"}`, "", ""},
		{"nulls are absent", `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":null,"n":null}`, "", ""},
		{"anthropic extensions", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}],"cache_control":{"type":"ephemeral"}}],"thinking":{"type":"enabled","budget_tokens":10}}`, "", ""},
		{"unknown role", `{"model":"m","messages":[{"role":"wizard","content":"hi"}]}`, "request.messages[0].role", `got "wizard"`},
		{"no role", `{"model":"m","messages":[{"content":"hi"}]}`, "request.messages[0].role", "is required"},
		{"no content", `{"model":"m","messages":[{"role":"user"}]}`, "request.messages[0].content", "is required"},
		{"null content", `{"model":"m","messages":[{"role":"system","content":null}]}`, "request.messages[0].content", "is required"},
		{"assistant with nothing", `{"model":"m","messages":[{"role":"assistant"}]}`, "request.messages[0].content", "without tool_calls"},
		{"top-level typo", `{"model":"m","temprature":0.2,"messages":[{"role":"user","content":"hi"}]}`, "request.temprature", `did you mean "temperature"`},
		{"message typo", `{"model":"m","messages":[{"role":"user","content":"hi","nmae":"x"}]}`, "request.messages[0].nmae", `did you mean "name"`},
		{"tool field on a user", `{"model":"m","messages":[{"role":"user","content":"hi","tool_call_id":"c"}]}`, "request.messages[0].tool_call_id", "user message"},
		{"temperature 7", `{"model":"m","temperature":7,"messages":[{"role":"user","content":"hi"}]}`, "request.temperature", "between 0 and 2, got 7"},
		{"top_p 1.5", `{"model":"m","top_p":1.5,"messages":[{"role":"user","content":"hi"}]}`, "request.top_p", "between 0 and 1"},
		{"n 0", `{"model":"m","n":0,"messages":[{"role":"user","content":"hi"}]}`, "request.n", "between 1 and 128"},
		{"n 1.5", `{"model":"m","n":1.5,"messages":[{"role":"user","content":"hi"}]}`, "request.n", "integer"},
		{"penalty", `{"model":"m","presence_penalty":-3,"messages":[{"role":"user","content":"hi"}]}`, "request.presence_penalty", "between -2 and 2"},
		{"frequency penalty", `{"model":"m","frequency_penalty":2.5,"messages":[{"role":"user","content":"hi"}]}`, "request.frequency_penalty", "between -2 and 2"},
		{"temperature a string", `{"model":"m","temperature":"hot","messages":[{"role":"user","content":"hi"}]}`, "request.temperature", "a number"},
		{"tool without id", `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"tool","content":"42"}]}`, "request.messages[1].tool_call_id", "is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := wire.CheckChat([]byte(tc.body), nil)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("got %v, want it to pass", err)
				}
				return
			}
			var ve *job.ValidationError
			if !errors.As(err, &ve) || ve.Field != tc.field || !strings.Contains(ve.Message, tc.msg) {
				t.Fatalf("got %v, want a refusal of %s saying %q", err, tc.field, tc.msg)
			}
		})
	}
}

// TestCheckChatAllowFields: a field the model's allow_fields names passes
// (a provider's own extension), at the top level and in a message; the
// others are still refused.
func TestCheckChatAllowFields(t *testing.T) {
	t.Parallel()
	allow := func(name string) bool { return name == "top_k" || name == "reasoning" }
	if _, err := wire.CheckChat([]byte(`{"model":"m","top_k":40,"messages":[{"role":"assistant","content":"a","reasoning":"r"}]}`), allow); err != nil {
		t.Fatalf("allowed fields: %v, want them to pass", err)
	}
	if _, err := wire.CheckChat([]byte(`{"model":"m","top_k":40,"min_p":0.1,"messages":[{"role":"user","content":"hi"}]}`), allow); err == nil || !strings.Contains(err.Error(), "min_p") {
		t.Fatalf("a field not allowed: %v, want min_p refused", err)
	}
}

// TestMessagesSchema: /v1/messages refuses what Anthropic would: a
// message member other than role and content, a missing content, a
// temperature above 1.
func TestMessagesSchema(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ body, want string }{
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi","nmae":"x"}]}`, "messages[0].nmae: Extra inputs"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user"}]}`, "messages[0].content: Field required"},
		{`{"model":"m","max_tokens":5,"temperature":1.5,"messages":[{"role":"user","content":"hi"}]}`, "temperature: must be between 0 and 1"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"hi"}]}`, "messages[0].role: must be user or assistant"},
	} {
		if _, _, err := wire.MessagesToChat([]byte(tc.body)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.body, err, tc.want)
		}
	}
	if _, _, err := wire.MessagesToChat([]byte(`{"model":"m","max_tokens":5,"temperature":1,"top_p":0.9,"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`)); err != nil {
		t.Errorf("a good body: %v", err)
	}
}

// checkChatMembers fails t unless CheckChat answers body as it does
// decoding with encoding/json and, passing body, returns its members as
// json.Unmarshal reads them into a map (ingest shapes the body from them).
func checkChatMembers(t *testing.T, body []byte) {
	t.Helper()
	got, err := wire.CheckChat(body, nil)
	stdGot, stdErr := wire.CheckChatStd(body, nil)
	if !reflect.DeepEqual(err, stdErr) || !reflect.DeepEqual(got, stdGot) {
		t.Fatalf("CheckChat(%q):\n got  %q, %v\n with encoding/json %q, %v", body, got, err, stdGot, stdErr)
	}
	if err != nil {
		var ve *job.ValidationError
		if !errors.As(err, &ve) || ve.Code != job.CodeInvalidRequest {
			t.Fatalf("CheckChat(%q) = %v, want a validation error", body, err)
		}
		return
	}
	var want map[string]json.RawMessage
	if err := json.Unmarshal(body, &want); err != nil {
		t.Fatalf("CheckChat(%q) passed a body json.Unmarshal refuses: %v", body, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("CheckChat(%q) members:\n got  %q\n want %q", body, got, want)
	}
}

var checkChatSeeds = []string{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, `{"temperature":7}`, `{"messages":[{"role":"tool"}]}`, `[]`, `{"n":1e400}`,
	`{"model":"m","max_tokens":null,"messages":[{"role":"user","content":"hi"}],"model":"n"}`, `null`, `{"model":"m","messages":"x"}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}], "temperature" : 0.5 }`,
	`{"model":"m","messages":[{"role":"tool","content":"x","tool_call_id":1}]}`, `{"model":"m","messages":[{"role":"us\u0065r","content":"x"},{"role":"\ud800"}]}`,
	`{"model":"m","n":1.0,"top_p":"1","messages":[{"role":"assistant","tool_calls":[]}]}`, "{\"model\":\"\xff\",\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"role\":\"system\"}]}"}

func TestCheckChatMembers(t *testing.T) {
	t.Parallel()
	for _, b := range checkChatSeeds {
		checkChatMembers(t, []byte(b))
	}
}

// FuzzCheckChat: any body is passed or refused with a validation error,
// never a panic; a body passed comes with its members.
func FuzzCheckChat(f *testing.F) {
	for _, b := range checkChatSeeds {
		f.Add([]byte(b))
	}
	f.Fuzz(checkChatMembers)
}

// BenchmarkCheckChat: the overhead benchmark's body, decoded by
// go-json-experiment's v1 API (CheckChat) and by encoding/json.
func BenchmarkCheckChat(b *testing.B) {
	body := []byte(`{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"Say hello to the benchmark."}]}`)
	for name, check := range map[string]func([]byte, func(string) bool) (map[string]json.RawMessage, error){"v1": wire.CheckChat, "std": wire.CheckChatStd} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				_, _ = check(body, nil)
			}
		})
	}
}
