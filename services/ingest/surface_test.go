package ingest

import (
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/wire"

	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/pkg/job"
)

// A queue_full answer tells an SDK to wait at most MaxRetryAfter, and its
// body says how long the queue really is.
func TestQueueFullRetryAfterCapped(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	// Model "slow" allows 2 requests a minute: two jobs ahead are a wait
	// of a minute and a half.
	slow := `{"model":"slow","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	for i := range 2 {
		if _, err := f.svc.Accept(ctx, &task.Task{Job: job.Job{Tenant: "acme", Request: json.RawMessage(slow)}}); err != nil {
			t.Fatalf("job %d: %v", i+1, err)
		}
	}
	f.svc.queue.qmu.Lock()
	f.svc.queue.qAt = time.Time{} // read the queue's depth afresh
	f.svc.queue.qmu.Unlock()

	mux := http.NewServeMux()
	f.svc.Routes(mux, api.Auth{Tenants: []string{"acme", "beta"}, Open: true})
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(slow))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sluice-Tenant", "acme")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("chat into a full queue: %d %s, want 429", rec.Code, rec.Body)
	}
	if got, want := rec.Header().Get("Retry-After"), strconv.Itoa(int(MaxRetryAfter/time.Second)); got != want {
		t.Errorf("Retry-After = %q, want the cap %s", got, want)
	}
	if got, want := rec.Header().Get("retry-after-ms"), strconv.FormatInt(MaxRetryAfter.Milliseconds(), 10); got != want {
		t.Errorf("retry-after-ms = %q, want %s", got, want)
	}
	var body struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
			Queue   struct {
				JobsAhead       int   `json:"jobs_ahead"`
				EstimatedWaitMS int64 `json:"estimated_wait_ms"`
				RetryAfterMS    int64 `json:"retry_after_ms"`
			} `json:"queue"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	q := body.Error.Queue
	if body.Error.Code != job.CodeQueueFull || q.JobsAhead != 2 || q.EstimatedWaitMS < 60_000 || q.RetryAfterMS != MaxRetryAfter.Milliseconds() {
		t.Errorf("body %s: want queue_full, 2 jobs ahead, an estimated wait of a minute or more, retry after the cap", rec.Body)
	}
	if !strings.Contains(body.Error.Message, "2 jobs ahead") || !strings.Contains(body.Error.Message, "estimated wait 1m") {
		t.Errorf("message %q does not say how long the queue is", body.Error.Message)
	}
}

// A short honest wait is not padded to the cap.
func TestWriteBusyShortWait(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	writeBusy(rec, &BusyError{Code: job.CodeQueueFull, RetryAfter: 2500 * time.Millisecond, Ahead: 7, Message: "full"})
	if got := rec.Header().Get("Retry-After"); got != "3" {
		t.Errorf("Retry-After = %q, want 3 (2.5 s rounded up)", got)
	}
	if got := rec.Header().Get("retry-after-ms"); got != "2500" {
		t.Errorf("retry-after-ms = %q, want 2500", got)
	}
}

func TestMessagesToChat(t *testing.T) {
	t.Parallel()
	in := `{
	  "model": "m", "max_tokens": 100, "temperature": 0.5, "stop_sequences": ["##"],
	  "system": [{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],
	  "metadata": {"user_id": "u1"},
	  "tools": [{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
	  "tool_choice": {"type":"any","disable_parallel_tool_use":true},
	  "messages": [
	    {"role":"user","content":[{"type":"text","text":"Weather in Paris?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]},
	    {"role":"assistant","content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"tu_1","name":"get_weather","input":{"city":"Paris"}}]},
	    {"role":"user","content":[{"type":"tool_result","tool_use_id":"tu_1","content":[{"type":"text","text":"sunny"}]},{"type":"text","text":"Thanks"}]}
	  ]
	}`
	out, model, err := wire.MessagesToChat([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if model != "m" {
		t.Errorf("model %q", model)
	}
	want := `{"max_tokens":100,"messages":[{"role":"system","content":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}]},` +
		`{"role":"user","content":[{"type":"text","text":"Weather in Paris?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]},` +
		`{"role":"assistant","content":"Let me look.","tool_calls":[{"id":"tu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
		`{"role":"tool","content":"sunny","tool_call_id":"tu_1"},{"role":"user","content":"Thanks"}],` +
		`"model":"m","parallel_tool_calls":false,"stop":["##"],"temperature":0.5,"tool_choice":"required",` +
		`"tools":[{"function":{"description":"Weather","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}},"type":"function"}],"user":"u1"}`
	if string(out) != want {
		t.Errorf("translated body:\n got %s\nwant %s", out, want)
	}
	// What Sluice validates and estimates is an ordinary chat body.
	if _, err := job.ParseRequest(out, job.DefaultLimits); err != nil {
		t.Errorf("translated body does not parse as chat: %v", err)
	}

	for _, tc := range []struct{ name, body, want string }{
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "max_tokens: Field required"},
		{"no model", `{"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "model: Field required"},
		{"top_k", `{"model":"m","max_tokens":5,"top_k":3,"messages":[{"role":"user","content":"hi"}]}`, "top_k: is not supported"},
		{"document block", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, "messages[0].content[0].type"},
		{"system role", `{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, "messages[0].role"},
		{"server tool", `{"model":"m","max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"hi"}]}`, "tools[0].type"},
		{"not an object", `[1]`, "not a JSON object"},
	} {
		if _, _, err := wire.MessagesToChat([]byte(tc.body)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestChatToMessage(t *testing.T) {
	t.Parallel()
	in := `{"id":"chatcmpl-abc","object":"chat.completion","model":"m","choices":[{"index":0,"finish_reason":"tool_calls",
	  "message":{"role":"assistant","content":"Checking.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}}],
	  "usage":{"prompt_tokens":50,"completion_tokens":7,"total_tokens":57,"prompt_tokens_details":{"cached_tokens":20}}}`
	out, err := wire.ChatToMessage([]byte(in), "asked")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}}],` +
		`"id":"msg_abc","model":"m","role":"assistant","stop_reason":"tool_use","stop_sequence":null,"type":"message",` +
		`"usage":{"cache_creation_input_tokens":0,"cache_read_input_tokens":20,"input_tokens":30,"output_tokens":7}}`
	if string(out) != want {
		t.Errorf("message:\n got %s\nwant %s", out, want)
	}
	for finish, stop := range map[string]string{"stop": "end_turn", "length": "max_tokens", "content_filter": "refusal"} {
		out, err := wire.ChatToMessage([]byte(`{"id":"x","choices":[{"finish_reason":"`+finish+`","message":{"content":"hi"}}]}`), "m")
		if err != nil || !strings.Contains(string(out), `"stop_reason":"`+stop+`"`) {
			t.Errorf("finish_reason %s: got %s %v, want stop_reason %s", finish, out, err, stop)
		}
	}
}

// An Anthropic request to an Anthropic provider goes through the chat shape
// twice (ingest translates it to chat, the executor's client back to a
// Messages body); what reaches the provider must keep the conversation,
// tools and limits, and its answer must come back as the same message.
func TestMessagesThroughAnthropicUpstream(t *testing.T) {
	t.Parallel()
	var upstream map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &upstream)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("request-id", "req_up")
		_, _ = w.Write([]byte(`{"id":"msg_up","type":"message","role":"assistant","model":"claude-x","stop_reason":"tool_use",
		  "content":[{"type":"text","text":"On it."},{"type":"tool_use","id":"toolu_2","name":"get_weather","input":{"city":"Rome"}}],
		  "usage":{"input_tokens":11,"output_tokens":5,"cache_read_input_tokens":4}}`))
	}))
	defer srv.Close()
	in := `{"model":"claude-x","max_tokens":64,"system":"Be brief.","stop_sequences":["##"],
	  "tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"get_weather"},
	  "messages":[{"role":"user","content":"Weather?"},
	    {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
	    {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"},{"type":"text","text":"And Rome?"}]}]}`
	chat, model, err := wire.MessagesToChat([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := provider.NewAnthropic(provider.AnthropicConfig{BaseURL: srv.URL, APIKey: "k"}).
		Do(context.Background(), provider.Call{Model: model, Body: chat})
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("upstream call: %v %+v", err, resp)
	}
	up, _ := json.Marshal(upstream)
	wantUp := `{"max_tokens":64,"messages":[{"content":[{"text":"Weather?","type":"text"}],"role":"user"},` +
		`{"content":[{"id":"toolu_1","input":{"city":"Paris"},"name":"get_weather","type":"tool_use"}],"role":"assistant"},` +
		`{"content":[{"content":"sunny","tool_use_id":"toolu_1","type":"tool_result"},{"text":"And Rome?","type":"text"}],"role":"user"}],` +
		`"model":"claude-x","stop_sequences":["##"],"system":"Be brief.","tool_choice":{"name":"get_weather","type":"tool"},` +
		`"tools":[{"input_schema":{"type":"object"},"name":"get_weather"}]}`
	if string(up) != wantUp {
		t.Errorf("Messages body the provider got:\n got %s\nwant %s", up, wantUp)
	}
	out, err := wire.ChatToMessage(resp.Body, model)
	if err != nil {
		t.Fatal(err)
	}
	wantOut := `{"content":[{"type":"text","text":"On it."},{"type":"tool_use","id":"toolu_2","name":"get_weather","input":{"city":"Rome"}}],` +
		`"id":"msg_up","model":"claude-x","role":"assistant","stop_reason":"tool_use","stop_sequence":null,"type":"message",` +
		`"usage":{"cache_creation_input_tokens":0,"cache_read_input_tokens":4,"input_tokens":11,"output_tokens":5}}`
	if string(out) != wantOut {
		t.Errorf("message back:\n got %s\nwant %s", out, wantOut)
	}
	if got := provider.RequestID(resp.Header); got != "req_up" {
		t.Errorf("request id %q, want req_up", got)
	}
}

func TestAnthropicErrorTypes(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]string{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
		404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 502: "api_error", 503: "overloaded_error", 504: "timeout_error"} {
		if got := wire.AnthropicErrorType(status); got != want {
			t.Errorf("status %d: %q, want %q", status, got, want)
		}
	}
}
