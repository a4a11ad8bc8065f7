package systest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestAnthropicSDK points the official Anthropic Go SDK at Sluice's
// /v1/messages, through the mesh to an OpenAI-compatible upstream (the
// simulator): a message, typed errors, and calls that wait in Sluice's
// queue for a low limit and still succeed, without a 429 at the provider.
func TestAnthropicSDK(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{
		{Name: "claude-sim", RPM: 100, TPM: 100000},
		{Name: "claude-slow", RPM: 30, TPM: 100000},
		{Name: "claude-cache", RPM: 100, ITPM: 100000, OTPM: 20000},
	}, APIKeys: []string{"sim-secret"}})
	n := Start(t, fmt.Sprintf(`
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: claude-sim, rpm: 100, tpm: 100000}
      - {name: claude-slow, rpm: 30, tpm: 100000}
  - name: claude
    kind: anthropic
    base_url: %[1]s/v1
    api_key_env: SIM_KEY
    models:
      - {name: claude-cache, rpm: 100, itpm: 100000, otpm: 20000}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
  - {name: globex, api_key_env: GLOBEX_KEY}
`, simURL), Env)
	_ = simSrv
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// x-api-key, as Anthropic's SDKs authenticate; no SDK retries, so every
	// wait seen here is Sluice's.
	c := anthropic.NewClient(option.WithBaseURL(n.HTTP+"/"), option.WithAPIKey("acme-key"), option.WithMaxRetries(0))

	t.Run("message", func(t *testing.T) {
		var httpResp *http.Response
		msg, err := c.Messages.New(ctx, anthropic.MessageNewParams{
			Model:     "claude-sim",
			MaxTokens: 64,
			System:    []anthropic.TextBlockParam{{Text: "Be brief."}},
			Messages: []anthropic.MessageParam{
				anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello.")),
				anthropic.NewAssistantMessage(anthropic.NewTextBlock("Hello")),
				anthropic.NewUserMessage(anthropic.NewTextBlock("Again, please.")),
			},
			StopSequences: []string{"###"},
		}, option.WithResponseInto(&httpResp))
		if err != nil {
			t.Fatalf("Messages.New through Sluice: %v", err)
		}
		if len(msg.Content) != 1 || msg.Content[0].Type != "text" || msg.Content[0].Text == "" {
			t.Fatalf("content %+v, want one text block", msg.Content)
		}
		if !strings.HasPrefix(msg.ID, "msg_") || msg.Role != "assistant" || msg.Model != "claude-sim" || msg.Type != "message" {
			t.Errorf("message id %q role %q model %q type %q, want msg_..., assistant, claude-sim, message", msg.ID, msg.Role, msg.Model, msg.Type)
		}
		if msg.StopReason != anthropic.StopReasonEndTurn && msg.StopReason != anthropic.StopReasonMaxTokens {
			t.Errorf("stop_reason %q", msg.StopReason)
		}
		if msg.Usage.InputTokens == 0 || msg.Usage.OutputTokens == 0 {
			t.Errorf("usage %+v, want input and output tokens", msg.Usage)
		}
		h := httpResp.Header
		if !strings.HasPrefix(h.Get("Request-Id"), "req_") {
			t.Errorf("request-id = %q, want the provider's", h.Get("Request-Id"))
		}
		if h.Get("Anthropic-Ratelimit-Requests-Limit") == "" || h.Get("Anthropic-Ratelimit-Tokens-Remaining") == "" {
			t.Errorf("no anthropic-ratelimit-* headers: %v", h)
		}
	})

	t.Run("stream", func(t *testing.T) {
		// stream: true relays the mesh's stream as Anthropic's events;
		// the SDK folds them into the message a plain call returns.
		params := anthropic.MessageNewParams{Model: "claude-sim", MaxTokens: 64,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Stream, please."))}}
		var httpResp *http.Response
		st := c.Messages.NewStreaming(ctx, params, option.WithResponseInto(&httpResp))
		var msg anthropic.Message
		var types []string
		for st.Next() {
			ev := st.Current()
			types = append(types, ev.Type)
			if err := msg.Accumulate(ev); err != nil {
				t.Fatalf("accumulating %s: %v", ev.Type, err)
			}
		}
		if err := st.Err(); err != nil {
			t.Fatalf("stream through Sluice: %v (events %v)", err, types)
		}
		deltas := 0
		for _, typ := range types {
			if typ == "content_block_delta" {
				deltas++
			}
		}
		if len(types) < 6 || types[0] != "message_start" || types[len(types)-1] != "message_stop" || deltas < 2 {
			t.Errorf("events %v, want message_start, a text block with its deltas (more than one), message_delta, message_stop", types)
		}
		if len(msg.Content) != 1 || msg.Content[0].Type != "text" || msg.Content[0].Text == "" {
			t.Errorf("content %+v, want one text block", msg.Content)
		}
		if !strings.HasPrefix(msg.ID, "msg_") || msg.Model != "claude-sim" || msg.Role != "assistant" {
			t.Errorf("message id %q model %q role %q", msg.ID, msg.Model, msg.Role)
		}
		if msg.StopReason != anthropic.StopReasonEndTurn && msg.StopReason != anthropic.StopReasonMaxTokens {
			t.Errorf("stop_reason %q", msg.StopReason)
		}
		if msg.Usage.InputTokens == 0 || msg.Usage.OutputTokens == 0 {
			t.Errorf("usage %+v, want input and output tokens", msg.Usage)
		}
		if ct := httpResp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") || httpResp.Header.Get("X-Sluice-Job-Id") == "" {
			t.Errorf("content type %q, job id %q: want an event stream and the job's id", ct, httpResp.Header.Get("X-Sluice-Job-Id"))
		}
		// A stream refused before it starts is a plain Anthropic error.
		params.Model = "claude-9"
		st = c.Messages.NewStreaming(ctx, params)
		for st.Next() {
		}
		var apiErr *anthropic.Error
		if !errors.As(st.Err(), &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Type() != anthropic.ErrorTypeNotFoundError {
			t.Errorf("streaming an unknown model: %v, want a 404 not_found_error", st.Err())
		}
	})

	t.Run("cache and thinking", func(t *testing.T) {
		// To an Anthropic provider, cache_control and thinking go as
		// sent (the simulator keeps what it received), and the second call
		// reads the prefix the first wrote.
		params := anthropic.MessageNewParams{Model: "claude-cache", MaxTokens: 2048,
			System:   []anthropic.TextBlockParam{{Text: strings.Repeat("You are terse. ", 400), CacheControl: anthropic.NewCacheControlEphemeralParam()}},
			Thinking: anthropic.ThinkingConfigParamOfEnabled(1024),
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("First turn."))}}
		first, err := c.Messages.New(ctx, params)
		if err != nil {
			t.Fatalf("first call: %v", err)
		}
		got := simSrv.Received()
		if len(got) == 0 {
			t.Fatal("the provider received nothing")
		}
		var sent struct {
			System []struct {
				CacheControl json.RawMessage `json:"cache_control"`
			} `json:"system"`
			Thinking json.RawMessage `json:"thinking"`
		}
		if err := json.Unmarshal(got[len(got)-1], &sent); err != nil {
			t.Fatal(err)
		}
		if len(sent.System) != 1 || string(sent.System[0].CacheControl) != `{"type":"ephemeral"}` || string(sent.Thinking) != `{"budget_tokens":1024,"type":"enabled"}` {
			t.Errorf("the provider received system %s and thinking %s, want the breakpoint and the thinking object as sent", sent.System, sent.Thinking)
		}
		params.Messages = []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Second turn."))}
		second, err := c.Messages.New(ctx, params)
		if err != nil {
			t.Fatalf("second call: %v", err)
		}
		if first.Usage.CacheCreationInputTokens == 0 || second.Usage.CacheReadInputTokens != first.Usage.CacheCreationInputTokens {
			t.Errorf("usage %+v then %+v, want the prefix written then read", first.Usage, second.Usage)
		}
	})

	t.Run("bad requests", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			client anthropic.Client
			params anthropic.MessageNewParams
			status int
			typ    anthropic.ErrorType
			msg    string
		}{
			{"max_tokens not positive", c, anthropic.MessageNewParams{Model: "claude-sim", MaxTokens: 0,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}},
				http.StatusBadRequest, anthropic.ErrorTypeInvalidRequestError, "max_tokens"},
			{"unknown model", c, anthropic.MessageNewParams{Model: "claude-9", MaxTokens: 10,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}},
				http.StatusNotFound, anthropic.ErrorTypeNotFoundError, "claude-9"},
			{"untranslatable field", c, anthropic.MessageNewParams{Model: "claude-sim", MaxTokens: 10,
				Messages:    []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
				ServiceTier: anthropic.MessageNewParamsServiceTierAuto},
				http.StatusBadRequest, anthropic.ErrorTypeInvalidRequestError, "service_tier"},
			{"thinking budget not below max_tokens", c, anthropic.MessageNewParams{Model: "claude-sim", MaxTokens: 10,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
				Thinking: anthropic.ThinkingConfigParamOfEnabled(1024)},
				http.StatusBadRequest, anthropic.ErrorTypeInvalidRequestError, "budget_tokens"},
			{"wrong key", anthropic.NewClient(option.WithBaseURL(n.HTTP+"/"), option.WithAPIKey("wrong"), option.WithMaxRetries(0)),
				anthropic.MessageNewParams{Model: "claude-sim", MaxTokens: 10,
					Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}},
				http.StatusUnauthorized, anthropic.ErrorTypeAuthenticationError, "API key"},
		} {
			_, err := tc.client.Messages.New(ctx, tc.params)
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) {
				t.Errorf("%s: got %v, want *anthropic.Error", tc.name, err)
				continue
			}
			if apiErr.StatusCode != tc.status || apiErr.Type() != tc.typ || !strings.Contains(apiErr.Message, tc.msg) {
				t.Errorf("%s: got %d %q %q, want %d %q mentioning %q", tc.name, apiErr.StatusCode, apiErr.Type(), apiErr.Message, tc.status, tc.typ, tc.msg)
			}
		}
		// The anthropic-version header is required, as Anthropic requires it.
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.HTTP+"/v1/messages",
			strings.NewReader(`{"model":"claude-sim","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-api-key", "acme-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"type":"error"`) || !strings.Contains(string(body), "anthropic-version") {
			t.Errorf("no anthropic-version: %d %s, want a 400 Anthropic error naming the header", resp.StatusCode, body)
		}
	})

	t.Run("rate-limit wait", func(t *testing.T) {
		// 30 RPM paces calls 2 s apart (more while the model warms up):
		// four at once wait in Sluice's queue, not at the provider, and
		// all succeed.
		const calls = 4
		start := time.Now()
		var wg sync.WaitGroup
		took := make([]time.Duration, calls)
		errs := make([]error, calls)
		for i := range calls {
			wg.Go(func() {
				_, errs[i] = c.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude-slow", MaxTokens: 16,
					Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(fmt.Sprintf("call %d", i)))}})
				took[i] = time.Since(start)
			})
		}
		wg.Wait()
		slowest := time.Duration(0)
		for i, err := range errs {
			if err != nil {
				t.Errorf("call %d: %v", i, err)
			}
			slowest = max(slowest, took[i])
		}
		if slowest < 3*time.Second {
			t.Errorf("the slowest of %d calls took %v; at 30 RPM the last cannot leave before 6 s, so Sluice did not hold it", calls, slowest)
		}
		st := simSrv.Stats().Models["claude-slow"]
		if st.Admitted != calls || st.RateLimited != 0 {
			t.Errorf("provider admitted %d and refused %d calls for rate, want %d and 0", st.Admitted, st.RateLimited, calls)
		}
	})
}
