package systest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// surfaceConfig is a Sluice config with an OpenAI-compatible provider (the
// simulator: a chat model and an embedding model) and an Anthropic one
// (never called: only refusals are tested against it).
func surfaceConfig(simURL string) string {
	return fmt.Sprintf(`
providers:
  - name: sim
    base_url: %[1]s/v1
    api_key_env: SIM_KEY
    models:
      - {name: gpt-4o-mini, rpm: 100, tpm: 100000}
      - {name: text-embedding-3-small, rpm: 100, tpm: 100000}
  - name: claude
    kind: anthropic
    base_url: %[1]s/never
    api_key_env: SIM_KEY
    models:
      - {name: claude-3-5-haiku, rpm: 100, itpm: 100000, otpm: 20000}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
`, simURL)
}

// TestOpenAISurface points the official OpenAI Go SDK at the endpoints
// beyond chat: the model list, embeddings through the mesh, n = 2, and the
// SDK's typed errors for an unknown route, a wrong method and bad
// parameters (with param set).
func TestOpenAISurface(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{
		{Name: "gpt-4o-mini", RPM: 100, TPM: 100000},
		{Name: "text-embedding-3-small", RPM: 100, TPM: 100000},
	}, APIKeys: []string{"sim-secret"}})
	n := Start(t, surfaceConfig(simURL), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey("acme-key"), option.WithMaxRetries(0))

	t.Run("models", func(t *testing.T) {
		page, err := c.Models.List(ctx)
		if err != nil {
			t.Fatalf("Models.List: %v", err)
		}
		owners := map[string]string{}
		for _, m := range page.Data {
			owners[m.ID] = m.OwnedBy
			if m.Object != "model" || m.Created == 0 {
				t.Errorf("model %+v: want object model and a creation time", m)
			}
		}
		want := map[string]string{"gpt-4o-mini": "sim", "text-embedding-3-small": "sim", "claude-3-5-haiku": "claude"}
		if len(owners) != len(want) {
			t.Errorf("Models.List: got %v, want %v", owners, want)
		}
		for id, owner := range want {
			if owners[id] != owner {
				t.Errorf("model %s: owned_by %q, want %q", id, owners[id], owner)
			}
		}
		m, err := c.Models.Get(ctx, "claude-3-5-haiku")
		if err != nil || m.ID != "claude-3-5-haiku" || m.OwnedBy != "claude" {
			t.Errorf("Models.Get(claude-3-5-haiku): got %+v, %v", m, err)
		}
		_, err = c.Models.Get(ctx, "gpt-9")
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" || apiErr.Param != "model" {
			t.Errorf("Models.Get(gpt-9): got %v, want a 404 model_not_found on param model", err)
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		inputs := []string{"hello world", "tiktoken is great!", "Sluice queues embeddings like chat"}
		before := scrape(t, n.MetricsURL()+"/metrics")
		resp, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: "text-embedding-3-small",
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs},
		})
		if err != nil {
			t.Fatalf("Embeddings.New: %v", err)
		}
		if len(resp.Data) != len(inputs) {
			t.Fatalf("got %d embeddings, want %d", len(resp.Data), len(inputs))
		}
		for i, e := range resp.Data {
			if e.Index != int64(i) || len(e.Embedding) != sim.EmbeddingDimensions {
				t.Errorf("embedding %d: index %d, %d dimensions; want index %d, %d dimensions", i, e.Index, len(e.Embedding), i, sim.EmbeddingDimensions)
			}
		}
		// Charged by input tokens: Sluice estimates them with the real
		// tokenizer (cl100k_base for text-embedding-3) and, the model's
		// first call, reserves them at the prior correction
		// (internal/calib); the provider charges and reports its own count.
		est := tokens.Embeddings(&job.EmbeddingsRequest{Model: "text-embedding-3-small", Texts: inputs})
		if est < 8 {
			t.Fatalf("token count %d is implausible", est)
		}
		after := scrape(t, n.MetricsURL()+"/metrics")
		r0, _ := sum(before, "llm_tokens_reserved_total", `model="text-embedding-3-small"`)
		r1, _ := sum(after, "llm_tokens_reserved_total", `model="text-embedding-3-small"`)
		// A loaded machine may place the job again (a late executor gives
		// its instant back): each placement reserves the same.
		if got, want := int(r1-r0), int(math.Ceil(float64(est)*calib.Prior)); got == 0 || got%want != 0 {
			t.Errorf("Sluice reserved %d tokens, want a multiple of %d (the input tokens %d at the prior correction)", got, want, est)
		}
		st := simSrv.Stats().Models["text-embedding-3-small"]
		if st.Admitted != 1 || st.ChargedTokens != resp.Usage.PromptTokens {
			t.Errorf("provider saw %d requests charged %d tokens; want one request (an array is one call) of the %d it reported", st.Admitted, st.ChargedTokens, resp.Usage.PromptTokens)
		}
	})

	t.Run("n=2", func(t *testing.T) {
		const maxTokens = 40
		msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Give me two greetings.")}
		before := scrape(t, n.MetricsURL()+"/metrics")
		var httpResp *http.Response
		resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: "gpt-4o-mini", Messages: msgs, MaxTokens: openai.Int(maxTokens), N: openai.Int(2),
		}, option.WithResponseInto(&httpResp))
		if err != nil {
			t.Fatalf("chat with n=2: %v", err)
		}
		if len(resp.Choices) != 2 || resp.Choices[0].Message.Content == "" || resp.Choices[1].Index != 1 {
			t.Fatalf("got choices %+v, want two", resp.Choices)
		}
		prompt := tokens.Prompt(&job.ChatRequest{Model: "gpt-4o-mini", Messages: []job.ChatMessage{{Role: "user", Content: []byte(`"Give me two greetings."`)}}})
		after := scrape(t, n.MetricsURL()+"/metrics")
		r0, _ := sum(before, "llm_tokens_reserved_total", `model="gpt-4o-mini"`)
		r1, _ := sum(after, "llm_tokens_reserved_total", `model="gpt-4o-mini"`)
		// The model's first call: the prompt at the prior correction.
		if got, want := int(r1-r0), int(math.Ceil(float64(prompt)*calib.Prior))+2*maxTokens; got == 0 || got%want != 0 {
			t.Errorf("Sluice reserved %d tokens, want a multiple of %d, one per placement (prompt %d × %g + 2 x max_tokens %d)", got, want, prompt, calib.Prior, maxTokens)
		}
		// The provider's request id and Sluice's view of the limits.
		h := httpResp.Header
		if id := h.Get("X-Request-Id"); !strings.HasPrefix(id, "req_") {
			t.Errorf("x-request-id = %q, want the provider's (req_...)", id)
		}
		// The limits in effect: the configured 100 RPM / 100,000 TPM, or
		// less while a new model warms up (half to whole over 10 s).
		limR, errR := strconv.Atoi(h.Get("X-Ratelimit-Limit-Requests"))
		limT, errT := strconv.Atoi(h.Get("X-Ratelimit-Limit-Tokens"))
		if errR != nil || errT != nil || limR < 50 || limR > 100 || limT < 50000 || limT > 100000 {
			t.Errorf("x-ratelimit-limit-requests/tokens = %q/%q, want the limits in effect (50-100 / 50,000-100,000)",
				h.Get("X-Ratelimit-Limit-Requests"), h.Get("X-Ratelimit-Limit-Tokens"))
		}
		if rem, err := strconv.Atoi(h.Get("X-Ratelimit-Remaining-Tokens")); err != nil || rem >= limT || rem < 0 {
			t.Errorf("x-ratelimit-remaining-tokens = %q, want below the limit %d", h.Get("X-Ratelimit-Remaining-Tokens"), limT)
		}
		if rem, err := strconv.Atoi(h.Get("X-Ratelimit-Remaining-Requests")); err != nil || rem >= limR || rem < 0 {
			t.Errorf("x-ratelimit-remaining-requests = %q, want below the limit %d", h.Get("X-Ratelimit-Remaining-Requests"), limR)
		}
		if h.Get("X-Sluice-Job-Id") == "" {
			t.Error("no X-Sluice-Job-Id")
		}
		// A warm-up's limits are said to be one (issue 37), beside the
		// configured ones; the deployment that served is named.
		wantState := "configured"
		if limR < 100 || limT < 100000 {
			wantState = "warming"
		}
		if got := h.Get("X-Sluice-Limit-State"); got != wantState || h.Get("X-Sluice-Ratelimit-Configured-Requests") != "100" ||
			h.Get("X-Sluice-Ratelimit-Configured-Tokens") != "100000" {
			t.Errorf("x-sluice-limit-state %q (limits in effect %d/%d), configured %q/%q; want %q and 100/100000", got, limR, limT,
				h.Get("X-Sluice-Ratelimit-Configured-Requests"), h.Get("X-Sluice-Ratelimit-Configured-Tokens"), wantState)
		}
		if got := h.Get("X-Sluice-Deployment"); got != "sim/gpt-4o-mini" {
			t.Errorf("x-sluice-deployment = %q, want sim/gpt-4o-mini", got)
		}
		if got := h.Get("X-Sluice-Request-Id"); !strings.HasPrefix(got, "req_") || got == h.Get("X-Request-Id") {
			t.Errorf("x-sluice-request-id = %q, want Sluice's own (req_...), apart from the provider's %q", got, h.Get("X-Request-Id"))
		}
	})

	t.Run("typed errors", func(t *testing.T) {
		var res map[string]any
		for _, tc := range []struct {
			name         string
			call         func() error
			status       int
			code, param  string
			msgFragments []string
		}{
			{"unknown route", func() error { return c.Post(ctx, "audio/speech", map[string]any{"model": "tts-1"}, &res) },
				http.StatusNotFound, "unknown_url", "", []string{"POST /v1/audio/speech"}},
			{"wrong method", func() error { return c.Get(ctx, "chat/completions", nil, &res) },
				http.StatusMethodNotAllowed, "method_not_allowed", "", []string{"use POST"}},
			{"bad max_tokens", func() error {
				_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini",
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(-5)})
				return err
			}, http.StatusBadRequest, job.CodeInvalidRequest, "max_tokens", []string{"must be positive"}},
			{"unknown model", func() error {
				_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-9",
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
				return err
			}, http.StatusNotFound, job.CodeUnknownModel, "model", []string{"gpt-9"}},
			{"n=2 on Anthropic", func() error {
				_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "claude-3-5-haiku",
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, N: openai.Int(2)})
				return err
			}, http.StatusBadRequest, job.CodeUnsupported, "n", []string{"Anthropic", "n separate requests"}},
			{"embeddings on Anthropic", func() error {
				_, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "claude-3-5-haiku",
					Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hi")}})
				return err
			}, http.StatusBadRequest, job.CodeUnsupported, "model", []string{"no embeddings API"}},
			{"empty embedding input", func() error {
				_, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "text-embedding-3-small",
					Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a", ""}}})
				return err
			}, http.StatusBadRequest, job.CodeInvalidRequest, "input[1]", []string{"must not be empty"}},
		} {
			err := tc.call()
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Errorf("%s: got %v, want *openai.Error", tc.name, err)
				continue
			}
			if apiErr.StatusCode != tc.status || apiErr.Code != tc.code || apiErr.Param != tc.param {
				t.Errorf("%s: got status %d code %q param %q, want %d %q %q", tc.name, apiErr.StatusCode, apiErr.Code, apiErr.Param, tc.status, tc.code, tc.param)
			}
			for _, f := range tc.msgFragments {
				if !strings.Contains(apiErr.Message, f) {
					t.Errorf("%s: message %q does not say %q", tc.name, apiErr.Message, f)
				}
			}
		}
		// The plain endpoints keep working next to the catch-all.
		for _, p := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get(n.HTTP + p)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("GET %s: %v %v", p, resp, err)
			}
			if resp != nil {
				resp.Body.Close()
			}
		}
		resp, err := http.Post(n.HTTP+"/healthz", "text/plain", nil)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed || !slices.Contains(strings.Split(resp.Header.Get("Allow"), ", "), "GET") {
				t.Errorf("POST /healthz: %d Allow %q, want 405 allowing GET", resp.StatusCode, resp.Header.Get("Allow"))
			}
		}
	})
	if st := simSrv.Stats(); st.Requests[http.StatusTooManyRequests] != 0 {
		t.Errorf("the provider answered %d 429s", st.Requests[http.StatusTooManyRequests])
	}
}
