package wire

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// canon re-encodes JSON so comparisons ignore formatting and key order.
func canon(t *testing.T, s []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(s, &v); err != nil {
		t.Fatalf("invalid JSON %s: %v", s, err)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

const anthropicMessage = `{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5",
 "content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"Let me check. "},{"type":"text","text":"One moment."},
  {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}],
 "stop_reason":"tool_use","stop_sequence":null,
 "usage":{"input_tokens":100,"output_tokens":20,"cache_creation_input_tokens":5,"cache_read_input_tokens":40}}`

func TestToAnthropic(t *testing.T) {
	t.Parallel()
	in := `{
	  "model": "claude-sonnet-4-5",
	  "max_completion_tokens": 300,
	  "max_tokens": 99,
	  "temperature": 0.2,
	  "top_p": 0.9,
	  "stop": "END",
	  "user": "u-1",
	  "parallel_tool_calls": false,
	  "tool_choice": {"type":"function","function":{"name":"get_weather"}},
	  "tools": [{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
	  "messages": [
	    {"role":"system","content":"You are terse."},
	    {"role":"developer","content":[{"type":"text","text":"Use metric."}]},
	    {"role":"user","content":[{"type":"text","text":"Weather in Paris?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]},
	    {"role":"user","content":"And a photo: "},
	    {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
	    {"role":"tool","tool_call_id":"call_1","content":"18C"},
	    {"role":"user","content":[{"type":"image_url","image_url":{"url":"https://img.example/cat.png"}}]},
	    {"role":"assistant","content":""}
	  ]
	}`
	got, err := ChatToAnthropic([]byte(in), "")
	if err != nil {
		t.Fatal(err)
	}
	want := `{
	  "model": "claude-sonnet-4-5",
	  "max_tokens": 300,
	  "system": "You are terse.\n\nUse metric.",
	  "temperature": 0.2,
	  "top_p": 0.9,
	  "stop_sequences": ["END"],
	  "metadata": {"user_id": "u-1"},
	  "tools": [{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
	  "tool_choice": {"type":"tool","name":"get_weather","disable_parallel_tool_use":true},
	  "messages": [
	    {"role":"user","content":[
	      {"type":"text","text":"Weather in Paris?"},
	      {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
	      {"type":"text","text":"And a photo: "}]},
	    {"role":"assistant","content":[{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}}]},
	    {"role":"user","content":[
	      {"type":"tool_result","tool_use_id":"call_1","content":"18C"},
	      {"type":"image","source":{"type":"url","url":"https://img.example/cat.png"}}]}
	  ]
	}`
	if canon(t, got) != canon(t, []byte(want)) {
		t.Errorf("got  %s\nwant %s", canon(t, got), canon(t, []byte(want)))
	}
}

func TestToAnthropicDefaults(t *testing.T) {
	t.Parallel()
	got, err := ChatToAnthropic([]byte(`{"model":"gpt-ish","messages":[{"role":"user","content":"hi"}],"stop":["a","b"],"tool_choice":"required","tools":[{"type":"function","function":{"name":"f"}}]}`), "claude-haiku-4-5")
	if err != nil {
		t.Fatal(err)
	}
	var req struct {
		Model      string         `json:"model"`
		MaxTokens  int            `json:"max_tokens"`
		System     *string        `json:"system"`
		Stop       []string       `json:"stop_sequences"`
		ToolChoice map[string]any `json:"tool_choice"`
		Tools      []struct {
			InputSchema map[string]any `json:"input_schema"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(got, &req); err != nil {
		t.Fatal(err)
	}
	if req.Model != "claude-haiku-4-5" || req.MaxTokens != DefaultAnthropicMaxTokens || req.System != nil {
		t.Errorf("%+v", req)
	}
	if !reflect.DeepEqual(req.Stop, []string{"a", "b"}) || req.ToolChoice["type"] != "any" || req.Tools[0].InputSchema["type"] != "object" {
		t.Errorf("%s", got)
	}
	got, _ = ChatToAnthropic([]byte(`{"model":"m","max_tokens":77,"messages":[{"role":"user","content":"hi"}],"tool_choice":"none"}`), "")
	if !strings.Contains(string(got), `"max_tokens":77`) || !strings.Contains(string(got), `"tool_choice":{"type":"none"}`) {
		t.Errorf("%s", got)
	}
}

func TestToAnthropicErrors(t *testing.T) {
	t.Parallel()
	const secret = "TOP-SECRET-PROMPT"
	for name, body := range map[string]string{
		"malformed":      `{"model":"m","messages":[{"role":"user","content":"` + secret,
		"stream":         `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + secret + `"}]}`,
		"no model":       `{"messages":[{"role":"user","content":"` + secret + `"}]}`,
		"role":           `{"model":"m","messages":[{"role":"function","content":"` + secret + `"}]}`,
		"only system":    `{"model":"m","messages":[{"role":"system","content":"` + secret + `"}]}`,
		"bad part":       `{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","text":"` + secret + `"}]}]}`,
		"bad image":      `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"file:///` + secret + `"}}]}]}`,
		"bad data url":   `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png,` + secret + `"}}]}]}`,
		"bad arguments":  `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"` + secret + `"}}]}]}`,
		"bad content":    `{"model":"m","messages":[{"role":"user","content":{"x":"` + secret + `"}}]}`,
		"bad stop":       `{"model":"m","stop":{"x":1},"messages":[{"role":"user","content":"` + secret + `"}]}`,
		"bad tool type":  `{"model":"m","tools":[{"type":"web_search"}],"messages":[{"role":"user","content":"` + secret + `"}]}`,
		"bad choice":     `{"model":"m","tool_choice":"maybe","messages":[{"role":"user","content":"` + secret + `"}]}`,
		"bad choice obj": `{"model":"m","tool_choice":{"type":"function"},"messages":[{"role":"user","content":"` + secret + `"}]}`,
	} {
		_, err := ChatToAnthropic([]byte(body), "")
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: error quotes the prompt: %v", name, err)
		}
	}
}

func TestFromAnthropic(t *testing.T) {
	t.Parallel()
	now := time.Unix(1700000000, 0)
	got, u, err := AnthropicToChat([]byte(anthropicMessage), now)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"msg_01","object":"chat.completion","created":1700000000,"model":"claude-sonnet-4-5",
	 "choices":[{"index":0,"finish_reason":"tool_calls","logprobs":null,"message":{"role":"assistant","content":"Let me check. One moment.","refusal":null,
	   "tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}}],
	 "usage":{"prompt_tokens":145,"completion_tokens":20,"total_tokens":165,"prompt_tokens_details":{"cached_tokens":40},
	   "cache_creation_input_tokens":5,"cache_read_input_tokens":40}}`
	if canon(t, got) != canon(t, []byte(want)) {
		t.Errorf("got  %s\nwant %s", canon(t, got), canon(t, []byte(want)))
	}
	if u.PromptTokens != 145 || u.CompletionTokens != 20 || u.TotalTokens != 165 || u.CachedTokens != 40 || u.CacheWriteTokens != 5 {
		t.Errorf("usage %+v", u)
	}
	for stop, finish := range map[string]string{"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "refusal": "content_filter"} {
		b, _, err := AnthropicToChat([]byte(`{"type":"message","content":[],"stop_reason":"`+stop+`","usage":{}}`), now)
		if err != nil || !strings.Contains(string(b), `"finish_reason":"`+finish+`"`) || !strings.Contains(string(b), `"content":""`) {
			t.Errorf("%s: %s %v", stop, b, err)
		}
	}
	if _, _, err := AnthropicToChat([]byte(`{"error":1}`), now); err == nil {
		t.Error("non-message accepted")
	}
}

// TestToAnthropicPassesCacheAndThinking: breakpoints on a system part, a
// content part, a tool and a whole message, and the thinking object, reach
// the Messages API body as sent.
func TestToAnthropicPassesCacheAndThinking(t *testing.T) {
	t.Parallel()
	in := `{"model":"claude-x","max_tokens":4000,"thinking":{"type":"enabled","budget_tokens":2000},
	 "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}},"cache_control":{"type":"ephemeral","ttl":"1h"}}],
	 "messages":[
	  {"role":"system","content":[{"type":"text","text":"rules","cache_control":{"type":"ephemeral"}}]},
	  {"role":"user","content":[{"type":"text","text":"doc","cache_control":{"type":"ephemeral"}},{"type":"text","text":"question"}]},
	  {"role":"assistant","content":"answer","cache_control":{"type":"ephemeral"}},
	  {"role":"user","content":"next"}]}`
	out, err := ChatToAnthropic([]byte(in), "")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"claude-x","max_tokens":4000,"system":[{"type":"text","text":"rules","cache_control":{"type":"ephemeral"}}],` +
		`"messages":[{"role":"user","content":[{"type":"text","text":"doc","cache_control":{"type":"ephemeral"}},{"type":"text","text":"question"}]},` +
		`{"role":"assistant","content":[{"type":"text","text":"answer","cache_control":{"type":"ephemeral"}}]},` +
		`{"role":"user","content":[{"type":"text","text":"next"}]}],` +
		`"tools":[{"name":"f","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral","ttl":"1h"}}],` +
		`"thinking":{"type":"enabled","budget_tokens":2000}}`
	if canon(t, out) != canon(t, []byte(want)) {
		t.Errorf("got  %s\nwant %s", canon(t, out), canon(t, []byte(want)))
	}
	// Without breakpoints the system prompt stays a string.
	out, _ = ChatToAnthropic([]byte(`{"model":"m","messages":[{"role":"system","content":"a"},{"role":"user","content":"b"}]}`), "")
	if !strings.Contains(string(out), `"system":"a"`) {
		t.Errorf("plain system prompt: %s", out)
	}
}
