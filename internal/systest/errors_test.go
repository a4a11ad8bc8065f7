package systest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// Issue 37, part 3: errors point at the right party.

// post sends body to path as tenant acme with extra headers and returns
// the status, headers and decoded body.
func post(t *testing.T, base, path, body string, hdr map[string]string) (int, http.Header, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer acme-key")
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, resp.Header, out
}

// readyz reads GET /readyz.
func readyz(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestProviderKeyRefused: a provider that refuses the operator's key is
// the deployment's problem: the official SDK (default retries) gets one
// 502 naming the deployment, with x-should-retry false and a request id,
// never the caller's invalid_api_key 400; the provider is called once; the
// deployment is marked down and /readyz says the node is degraded (another
// deployment still serves).
func TestProviderKeyRefused(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 1_000_000}, {Name: "gpt-4o", RPM: 600, TPM: 1_000_000}},
		APIKeys: []string{"sim-secret"}})
	yaml := fmt.Sprintf(`
providers:
  - name: sim
    base_url: %[1]s/v1
    api_key_env: SIM_KEY
    models:
      - {name: gpt-4o-mini, rpm: 600, tpm: 1000000}
  - name: wrongkey
    base_url: %[1]s/v1
    api_key_env: WRONG_KEY
    models:
      - {name: gpt-4o, rpm: 600, tpm: 1000000}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
`, simURL)
	env := maps.Clone(Env)
	env["WRONG_KEY"] = "not-the-key"
	n := StartLogged(t, yaml, env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var seen attempts
	c := openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey("acme-key"), option.WithMiddleware(seen.middleware))
	var httpResp *http.Response
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o", MaxTokens: openai.Int(8),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}, option.WithResponseInto(&httpResp))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("got %v, want an API error", err)
	}
	if apiErr.StatusCode != http.StatusBadGateway || apiErr.Code != "deployment_auth_failed" || !strings.Contains(apiErr.Message, "deployment wrongkey/gpt-4o") ||
		strings.Contains(apiErr.Message, "Incorrect API key") {
		t.Errorf("got %d %q %q, want 502 deployment_auth_failed naming deployment wrongkey/gpt-4o", apiErr.StatusCode, apiErr.Code, apiErr.Message)
	}
	h := apiErr.Response.Header
	if h.Get("X-Should-Retry") != "false" || !strings.HasPrefix(h.Get("X-Sluice-Request-Id"), "req_") || h.Get("X-Sluice-Deployment") != "wrongkey/gpt-4o" {
		t.Errorf("headers x-should-retry %q, x-sluice-request-id %q, x-sluice-deployment %q; want false, req_..., wrongkey/gpt-4o",
			h.Get("X-Should-Retry"), h.Get("X-Sluice-Request-Id"), h.Get("X-Sluice-Deployment"))
	}
	if got := len(seen.seen()); got != 1 {
		t.Errorf("the SDK sent %d requests, want 1 (no retry)", got)
	}
	if got := simSrv.Stats().Requests[http.StatusUnauthorized]; got != 1 {
		t.Errorf("the provider refused %d calls, want 1", got)
	}
	code, body := readyz(t, n.HTTP)
	if code != http.StatusOK || !strings.Contains(body, "degraded") || !strings.Contains(body, "wrongkey/gpt-4o") || strings.Contains(body, "sim/gpt-4o-mini") {
		t.Errorf("/readyz: %d %q, want 200 degraded naming wrongkey/gpt-4o only", code, body)
	}
	if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini", MaxTokens: openai.Int(8),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}); err != nil {
		t.Errorf("the deployment that works: %v", err)
	}
}

// TestProviderUnreachable: an endpoint nothing listens on ends the job
// after one attempt (not five in three seconds) with a 503 naming the
// deployment and not its address; the deployment is down and /readyz
// answers 503, no deployment being able to serve.
func TestProviderUnreachable(t *testing.T) {
	t.Parallel()
	addr := closedPort(t)
	n := StartLogged(t, SimConfig("http://"+addr, "gpt-4o-mini", 600, 1_000_000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	status, h, out := post(t, n.HTTP, "/v1/chat/completions", string(ChatBody("gpt-4o-mini", 3, 8)), nil)
	e, _ := out["error"].(map[string]any)
	msg, _ := e["message"].(string)
	if status != http.StatusServiceUnavailable || e["code"] != "deployment_unreachable" || !strings.Contains(msg, "deployment sim/gpt-4o-mini") ||
		strings.Contains(msg, addr) || strings.Contains(msg, "127.0.0.1") {
		t.Errorf("got %d %v, want 503 deployment_unreachable naming sim/gpt-4o-mini and not %s", status, out, addr)
	}
	if h.Get("X-Should-Retry") != "false" || h.Get("X-Sluice-Request-Id") == "" {
		t.Errorf("x-should-retry %q, request id %q", h.Get("X-Should-Retry"), h.Get("X-Sluice-Request-Id"))
	}
	// The answer comes from the result as it is published; the job's
	// record is written by the result service just after: wait for it.
	j := GetJob(t, ctx, n.HTTP, "acme-key", h.Get("X-Sluice-Job-Id"), "20s")
	res, _ := j["result"].(map[string]any)
	if got, _ := res["attempts"].(float64); got != 1 {
		t.Errorf("the job made %v attempts, want 1 (the deployment is down: no retry on the job's clock): %v", res["attempts"], j)
	}
	if raw, _ := json.Marshal(j); strings.Contains(string(raw), addr) {
		t.Errorf("the job's record names the endpoint's address %s: %s", addr, raw)
	}
	code, body := readyz(t, n.HTTP)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "every deployment is down: sim/gpt-4o-mini") {
		t.Errorf("/readyz: %d %q, want 503 naming the down deployment", code, body)
	}
}

// TestPastDeadlineIsTheCallersError: a deadline already past is the
// caller's 400 with x-should-retry false, which the official SDK (default
// retries) sends once; the provider sees nothing.
func TestPastDeadlineIsTheCallersError(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 1_000_000}}, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 1_000_000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var seen attempts
	c := openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey("acme-key"), option.WithMiddleware(seen.middleware))
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini", MaxTokens: openai.Int(8),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}},
		option.WithHeader("X-Sluice-Deadline", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Code != "deadline_expired" ||
		!strings.HasPrefix(apiErr.Message, "X-Sluice-Deadline: ") {
		t.Fatalf("got %v, want 400 deadline_expired naming the header (not the envelope's deadline)", err)
	}
	if h := apiErr.Response.Header; h.Get("X-Should-Retry") != "false" || h.Get("X-Request-Id") == "" {
		t.Errorf("x-should-retry %q, x-request-id %q; want false and an id", h.Get("X-Should-Retry"), h.Get("X-Request-Id"))
	}
	if got := len(seen.seen()); got != 1 {
		t.Errorf("the SDK sent %d requests, want 1", got)
	}
	if got := totalRequests(simSrv.Stats()); got != 0 {
		t.Errorf("the provider saw %d requests, want 0", got)
	}
}

// TestMalformedRequestsNeverReachTheProvider: what the provider would
// refuse as malformed is refused by Sluice with a 400 that names the
// field as the API does (never request.<field>), a request id on each;
// nothing reaches the provider or is charged. A field the model's
// allow_fields names is let through.
func TestMalformedRequestsNeverReachTheProvider(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 1_000_000}, {Name: "vllm-model", RPM: 600, TPM: 1_000_000}},
		APIKeys: []string{"sim-secret"}})
	yaml := strings.Replace(SimConfig(simURL, "gpt-4o-mini", 600, 1_000_000, ""), "max_concurrency: 128}",
		"max_concurrency: 128}\n      - {name: vllm-model, rpm: 600, tpm: 1000000, allow_fields: [top_k]}", 1)
	n := Start(t, yaml, Env)
	hi := `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct{ name, path, body, param string }{ // param: the message's first words too
		{"no model", "/v1/chat/completions", `{` + hi + `}`, "model"},
		{"role wizard", "/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"wizard","content":"hi"}]}`, "messages[0].role"},
		{"no content", "/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user"}]}`, "messages[0].content"},
		{"temprature", "/v1/chat/completions", `{"model":"gpt-4o-mini","temprature":0.5,` + hi + `}`, "temprature"},
		{"nmae", "/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi","nmae":"bob"}]}`, "messages[0].nmae"},
		{"temperature 7", "/v1/chat/completions", `{"model":"gpt-4o-mini","temperature":7,` + hi + `}`, "temperature"},
		{"top_p", "/v1/chat/completions", `{"model":"gpt-4o-mini","top_p":3,` + hi + `}`, "top_p"},
		{"n", "/v1/chat/completions", `{"model":"gpt-4o-mini","n":0,` + hi + `}`, "n"},
		{"penalty", "/v1/chat/completions", `{"model":"gpt-4o-mini","frequency_penalty":9,` + hi + `}`, "frequency_penalty"},
		{"tool without id", "/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"},{"role":"tool","content":"42"}]}`, "messages[1].tool_call_id"},
		{"unknown field on another model", "/v1/chat/completions", `{"model":"gpt-4o-mini","top_k":40,` + hi + `}`, "top_k"},
		{"envelope", "/v1/jobs", `{"request":{"model":"gpt-4o-mini","messages":[{"role":"wizard","content":"hi"}]}}`, "messages[0].role"},
	} {
		status, h, out := post(t, n.HTTP, tc.path, tc.body, nil)
		e, _ := out["error"].(map[string]any)
		msg, _ := e["message"].(string)
		named := tc.param
		if tc.path == "/v1/jobs" {
			named = "request." + tc.param // the jobs API's body is the envelope
		}
		if status != http.StatusBadRequest || e["param"] != tc.param || !strings.HasPrefix(msg, named+": ") {
			t.Errorf("%s: got %d %v, want 400 with param %s and a message that names it first", tc.name, status, out, tc.param)
		}
		if tc.path != "/v1/jobs" && strings.Contains(msg, "request.") {
			t.Errorf("%s: the message names an envelope path: %q", tc.name, msg)
		}
		if h.Get("X-Request-Id") == "" || h.Get("X-Should-Retry") != "false" {
			t.Errorf("%s: x-request-id %q, x-should-retry %q", tc.name, h.Get("X-Request-Id"), h.Get("X-Should-Retry"))
		}
	}
	msgs := func(body string) (int, map[string]any) {
		status, _, out := post(t, n.HTTP, "/v1/messages", body, map[string]string{"Anthropic-Version": "2023-06-01"})
		return status, out
	}
	for _, body := range []string{
		`{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"wizard","content":"hi"}]}`,
		`{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"hi","nmae":"x"}]}`,
		`{"model":"gpt-4o-mini","max_tokens":8,"temperature":1.5,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4o-mini","max_tokens":8,"temprature":0.5,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user"}]}`,
	} {
		if status, out := msgs(body); status != http.StatusBadRequest || out["type"] != "error" || !strings.HasPrefix(fmt.Sprint(out["request_id"]), "req_") {
			t.Errorf("/v1/messages %s: got %d %v, want 400 with a request_id", body, status, out)
		}
	}
	if got := totalRequests(simSrv.Stats()); got != 0 {
		t.Errorf("the provider saw %d requests, want 0", got)
	}
	if got := MetricSum(t, n.MetricsURL(), "llm_tokens_reserved_total"); got != 0 {
		t.Errorf("%.0f tokens reserved for refused requests, want 0", got)
	}
	// The opt-out: vllm-model's allow_fields lets its provider's top_k through.
	if status, _, out := post(t, n.HTTP, "/v1/chat/completions", `{"model":"vllm-model","max_tokens":8,"top_k":40,`+hi+`}`, nil); status != http.StatusOK {
		t.Fatalf("top_k on a model that allows it: %d %v, want 200", status, out)
	}
	reqs := simSrv.Requests()
	if len(reqs) != 1 || !strings.Contains(string(reqs[0].Body), `"top_k":40`) {
		t.Errorf("the provider got %d requests (%v), want the one with top_k", len(reqs), reqs)
	}
}

// TestRequestIDOnEveryAnswer: refusals (401, 404), cache hits and the
// error event inside a stream carry a request id.
func TestRequestIDOnEveryAnswer(t *testing.T) {
	t.Parallel()
	_, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 1_000_000}, {Name: "gpt-4o", RPM: 600, TPM: 1_000_000}},
		APIKeys: []string{"sim-secret"}, Faults: sim.Faults{QuotaModels: []string{"gpt-4o"}}})
	yaml := strings.Replace(SimConfig(simURL, "gpt-4o-mini", 600, 1_000_000, "cache: {tenants: {acme: 1h}}\n"), "max_concurrency: 128}",
		"max_concurrency: 128}\n      - {name: gpt-4o, rpm: 600, tpm: 1000000}", 1)
	n := Start(t, yaml, Env)
	for _, tc := range []struct {
		name, path, key string
		want            int
	}{{"401", "/v1/chat/completions", "wrong", 401}, {"404 path", "/v1/nothing", "acme-key", 404}, {"404 model", "/v1/models/none", "acme-key", 404}} {
		req, _ := http.NewRequest(http.MethodPost, n.HTTP+tc.path, strings.NewReader(string(ChatBody("gpt-4o-mini", 2, 8))))
		if tc.name == "404 model" {
			req.Method = http.MethodGet
		}
		req.Header.Set("Authorization", "Bearer "+tc.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want || !strings.HasPrefix(resp.Header.Get("X-Request-Id"), "req_") {
			t.Errorf("%s: %d with x-request-id %q, want %d with an id", tc.name, resp.StatusCode, resp.Header.Get("X-Request-Id"), tc.want)
		}
	}
	body := `{"model":"gpt-4o-mini","max_tokens":8,"temperature":0,"messages":[{"role":"user","content":"cache me"}]}`
	status, first, _ := post(t, n.HTTP, "/v1/chat/completions", body, nil)
	if status != http.StatusOK {
		t.Fatalf("cacheable call: %d", status)
	}
	status, h, _ := post(t, n.HTTP, "/v1/chat/completions", body, nil)
	if status != http.StatusOK || !strings.EqualFold(h.Get("X-Sluice-Cache"), "hit") {
		t.Fatalf("the same call again: %d, x-sluice-cache %q, want a hit", status, h.Get("X-Sluice-Cache"))
	}
	if id := h.Get("X-Sluice-Request-Id"); !strings.HasPrefix(id, "req_") || id == first.Get("X-Sluice-Request-Id") || h.Get("X-Request-Id") == "" {
		t.Errorf("cache hit: x-sluice-request-id %q (the first call's %q), x-request-id %q; want an id of its own", id, first.Get("X-Sluice-Request-Id"), h.Get("X-Request-Id"))
	}
	// A stream whose job fails (out of quota) ends with an error event
	// that names the request.
	req, _ := http.NewRequest(http.MethodPost, n.HTTP+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer acme-key")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rid := resp.Header.Get("X-Sluice-Request-Id")
	var event struct {
		Error struct {
			Code      string `json:"code"`
			Message   string `json:"message"`
			RequestID string `json:"request_id"`
		} `json:"error"`
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && strings.Contains(data, `"error"`) {
			_ = json.Unmarshal([]byte(data), &event)
			break
		}
	}
	if rid == "" || event.Error.RequestID != rid || event.Error.Code != "insufficient_quota" || !strings.Contains(event.Error.Message, "deployment sim/gpt-4o") {
		t.Errorf("stream error event %+v, want insufficient_quota naming deployment sim/gpt-4o, request_id %q", event.Error, rid)
	}
}

// TestSimulatorToolsThroughSluice: through Sluice, the official SDK gets
// the simulator's tool call (tool_choice required) with arguments that
// unmarshal into the schema's struct, and JSON of a response_format's
// schema.
func TestSimulatorToolsThroughSluice(t *testing.T) {
	t.Parallel()
	_, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 1_000_000}}, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 1_000_000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := SDK(n)
	type args struct {
		City string `json:"city"`
		Days int    `json:"days"`
	}
	schema := map[string]any{"type": "object", "required": []any{"city", "days"}, "additionalProperties": false,
		"properties": map[string]any{"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer", "minimum": 1}}}
	r, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini", MaxTokens: openai.Int(32),
		Messages:   []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather?")},
		Tools:      []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "forecast", Parameters: schema})},
		ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}})
	if err != nil {
		t.Fatal(err)
	}
	var a args
	if r.Choices[0].FinishReason != "tool_calls" || len(r.Choices[0].Message.ToolCalls) != 1 ||
		json.Unmarshal([]byte(r.Choices[0].Message.ToolCalls[0].Function.Arguments), &a) != nil || a.City == "" || a.Days < 1 {
		t.Fatalf("got %+v, want one forecast call with the schema's arguments", r.Choices[0])
	}
	r, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini", MaxTokens: openai.Int(32),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather?")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "forecast", Schema: schema}}}})
	if err != nil {
		t.Fatal(err)
	}
	a = args{}
	if err := json.Unmarshal([]byte(r.Choices[0].Message.Content), &a); err != nil || a.City == "" || a.Days < 1 {
		t.Fatalf("json_schema answer %q (%v), want the schema's JSON", r.Choices[0].Message.Content, err)
	}
}
