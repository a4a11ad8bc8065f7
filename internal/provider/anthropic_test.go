package provider

import (
	"github.com/sluice-dev/sluice/internal/wire"

	"encoding/json"
	"io"
	"net/http"
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
	got, err := wire.ChatToAnthropic([]byte(in), "")
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
	got, err := wire.ChatToAnthropic([]byte(`{"model":"gpt-ish","messages":[{"role":"user","content":"hi"}],"stop":["a","b"],"tool_choice":"required","tools":[{"type":"function","function":{"name":"f"}}]}`), "claude-haiku-4-5")
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
	got, _ = wire.ChatToAnthropic([]byte(`{"model":"m","max_tokens":77,"messages":[{"role":"user","content":"hi"}],"tool_choice":"none"}`), "")
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
		_, err := wire.ChatToAnthropic([]byte(body), "")
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: error quotes the prompt: %v", name, err)
		}
	}
}

const anthropicMessage = `{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5",
 "content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"Let me check. "},{"type":"text","text":"One moment."},
  {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}],
 "stop_reason":"tool_use","stop_sequence":null,
 "usage":{"input_tokens":100,"output_tokens":20,"cache_creation_input_tokens":5,"cache_read_input_tokens":40}}`

func TestFromAnthropic(t *testing.T) {
	t.Parallel()
	now := time.Unix(1700000000, 0)
	got, u, err := wire.AnthropicToChat([]byte(anthropicMessage), now)
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
	if ParseUsage(got) != u {
		t.Errorf("ParseUsage disagrees: %+v", ParseUsage(got))
	}
	for stop, finish := range map[string]string{"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "refusal": "content_filter"} {
		b, _, err := wire.AnthropicToChat([]byte(`{"type":"message","content":[],"stop_reason":"`+stop+`","usage":{}}`), now)
		if err != nil || !strings.Contains(string(b), `"finish_reason":"`+finish+`"`) || !strings.Contains(string(b), `"content":""`) {
			t.Errorf("%s: %s %v", stop, b, err)
		}
	}
	if _, _, err := wire.AnthropicToChat([]byte(`{"error":1}`), now); err == nil {
		t.Error("non-message accepted")
	}
}

func TestAnthropicClient(t *testing.T) {
	t.Parallel()
	type seen struct {
		path, key, version, auth, idem, job string
		body                                []byte
	}
	got := make(chan seen, 1)
	reset := time.Now().Add(30 * time.Second).UTC().Format(time.RFC3339)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.URL.Path, r.Header.Get("X-Api-Key"), r.Header.Get("Anthropic-Version"), r.Header.Get("Authorization"), r.Header.Get("Idempotency-Key"), r.Header.Get("X-Sluice-Job-Id"), b}
		h := w.Header()
		h.Set("Anthropic-Ratelimit-Requests-Limit", "50")
		h.Set("Anthropic-Ratelimit-Requests-Remaining", "49")
		h.Set("Anthropic-Ratelimit-Requests-Reset", reset)
		h.Set("Anthropic-Ratelimit-Tokens-Limit", "80000")
		h.Set("Anthropic-Ratelimit-Tokens-Remaining", "79000")
		h.Set("Anthropic-Ratelimit-Tokens-Reset", reset)
		_, _ = io.WriteString(w, anthropicMessage)
	})
	c := NewAnthropic(AnthropicConfig{BaseURL: srv.URL + "/v1", APIKey: "sk-ant-test", HeaderTimeout: time.Second})
	t.Cleanup(c.CloseIdleConnections)
	body := `{"model":"claude-sonnet-4-5","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]}`
	resp, err := c.Do(t.Context(), Call{Provider: "anthropic", Body: []byte(body), IdempotencyKey: "idem", JobID: "job"})
	if err != nil {
		t.Fatal(err)
	}
	s := <-got
	if s.path != "/v1/messages" || s.key != "sk-ant-test" || s.version != DefaultAnthropicVersion || s.auth != "" || s.idem != "idem" || s.job != "job" {
		t.Errorf("request %+v", s)
	}
	var req struct {
		System    string `json:"system"`
		MaxTokens int    `json:"max_tokens"`
		Messages  []struct {
			Role string `json:"role"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(s.body, &req); err != nil || req.System != "Be brief." || req.MaxTokens != 1024 || len(req.Messages) != 1 || req.Messages[0].Role != "user" {
		t.Errorf("sent %s (%v)", s.body, err)
	}
	var out struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(resp.Body, &out); err != nil || out.Object != "chat.completion" || out.Choices[0].Message.Content != "Let me check. One moment." {
		t.Errorf("converted body %s", resp.Body)
	}
	if resp.Usage.PromptTokens != 145 || resp.Usage.CachedTokens != 40 || resp.Usage.CompletionTokens != 20 {
		t.Errorf("usage %+v", resp.Usage)
	}
	rl := resp.RateLimit
	if rl.LimitRequests != 50 || rl.RemainingRequests != 49 || rl.LimitTokens != 80000 || rl.RemainingTokens != 79000 ||
		rl.ResetRequests < 25*time.Second || rl.ResetRequests > 31*time.Second || rl.ResetTokens != rl.ResetRequests {
		t.Errorf("ratelimit %+v", rl)
	}
}

func TestAnthropicErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status int
		header http.Header
		body   string
		class  Class
		code   string
		limit  string
		retry  time.Duration
	}{
		{429, http.Header{"Retry-After": {"5"}}, antErr("rate_limit_error", "This request would exceed your organization's rate limit of 40,000 output tokens per minute."), Retry, "rate_limit_error", "tokens", 5 * time.Second},
		{529, nil, antErr("overloaded_error", "Overloaded"), Overloaded, "overloaded_error", "", 0},
		{401, nil, antErr("authentication_error", "invalid x-api-key"), AuthBroken, "authentication_error", "", 0},
		{400, nil, antErr("invalid_request_error", "Your credit balance is too low to access the Anthropic API."), OperatorAction, "invalid_request_error", "", 0},
		{400, nil, antErr("invalid_request_error", "prompt is too long"), Fail, "invalid_request_error", "", 0},
		{404, nil, antErr("not_found_error", "model: nope"), Fail, "not_found_error", "", 0},
		{502, nil, `<html>bad gateway</html>`, Overloaded, "http_502", "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tc.header {
					w.Header()[k] = v
				}
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			})
			c := NewAnthropic(AnthropicConfig{BaseURL: srv.URL, APIKey: "k"})
			t.Cleanup(c.CloseIdleConnections)
			resp, err := c.Do(t.Context(), Call{Body: []byte(chatBody)})
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(tc.body, "{") {
				var e struct {
					Error struct {
						Type    string `json:"type"`
						Message string `json:"message"`
					} `json:"error"`
				}
				if json.Unmarshal(resp.Body, &e) != nil || e.Error.Type != tc.code || strings.Contains(string(resp.Body), `"type":"error"`) {
					t.Errorf("error body not in OpenAI shape: %s", resp.Body)
				}
			} else if string(resp.Body) != tc.body {
				t.Errorf("non-JSON body altered: %s", resp.Body)
			}
			o := Classify(resp, nil, time.Now())
			if o.Class != tc.class || o.Code != tc.code || o.LimitType != tc.limit || o.RetryAfter != tc.retry || o.HTTPStatus != tc.status {
				t.Errorf("%+v", o)
			}
			// The raw Anthropic body classifies the same way.
			raw := Classify(&Response{Status: tc.status, Header: tc.header, Body: []byte(tc.body)}, nil, time.Now())
			if raw.Class != o.Class || raw.Code != o.Code {
				t.Errorf("raw body classified differently: %+v", raw)
			}
		})
	}
}

func TestAnthropicBuildError(t *testing.T) {
	t.Parallel()
	c := NewAnthropic(AnthropicConfig{APIKey: "k", Transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
		t.Error("nothing should be sent")
		return nil, io.EOF
	})})
	if c.baseURL != DefaultAnthropicBaseURL || c.version != DefaultAnthropicVersion {
		t.Errorf("defaults %q %q", c.baseURL, c.version)
	}
	_, err := c.Do(t.Context(), Call{Body: []byte(`{"model":"m","messages":[{"role":"function","content":"x"}]}`)})
	if te := transportError(t, err); te.Phase != PhaseBuild {
		t.Errorf("phase %s", te.Phase)
	}
	if o := Classify(nil, err, time.Now()); o.Class != Fail || !o.SafeToRetry {
		t.Errorf("%+v", o)
	}
}
