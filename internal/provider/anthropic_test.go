package provider

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/wire"
)

// anthropicMessage is a Messages API answer with every kind of content block.
const anthropicMessage = `{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5",
 "content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"Let me check. "},{"type":"text","text":"One moment."},
  {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}],
 "stop_reason":"tool_use","stop_sequence":null,
 "usage":{"input_tokens":100,"output_tokens":20,"cache_creation_input_tokens":5,"cache_read_input_tokens":40}}`

// TestParseUsageOfAnthropic: the usage the translation reports is the one
// ParseUsage reads from its chat body.
func TestParseUsageOfAnthropic(t *testing.T) {
	t.Parallel()
	got, u, err := wire.AnthropicToChat([]byte(anthropicMessage), time.Unix(1700000000, 0))
	if err != nil {
		t.Fatal(err)
	}
	if ParseUsage(got) != u {
		t.Errorf("ParseUsage %+v, the translation %+v", ParseUsage(got), u)
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
