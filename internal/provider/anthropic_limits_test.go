package provider

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/job"
)

// TestAnthropicHeadersAndUsage: Anthropic's rate-limit headers give the
// input and output buckets apart (the combined "tokens" headers only when
// no input-tokens ones came), resets are RFC 3339 instants, and usage keeps
// cache reads and writes apart.
func TestAnthropicHeadersAndUsage(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339) }
	for _, tc := range []struct {
		name   string
		header map[string]string
		want   RateLimit
	}{
		{"all dimensions", map[string]string{
			"requests-limit": "50", "requests-remaining": "49", "requests-reset": at(time.Second),
			"input-tokens-limit": "30000", "input-tokens-remaining": "29000", "input-tokens-reset": at(2 * time.Second),
			"output-tokens-limit": "8000", "output-tokens-remaining": "7500", "output-tokens-reset": at(4 * time.Second),
			"tokens-limit": "8000", "tokens-remaining": "7500", "tokens-reset": at(4 * time.Second)},
			RateLimit{50, 30000, 49, 29000, time.Second, 2 * time.Second, 8000, 7500, 4 * time.Second}},
		{"combined tokens only", map[string]string{"tokens-limit": "40000", "tokens-remaining": "100", "tokens-reset": at(time.Minute)},
			RateLimit{-1, 40000, -1, 100, 0, time.Minute, -1, -1, 0}},
		{"output only, reset past", map[string]string{"output-tokens-limit": "8000", "output-tokens-remaining": "0", "output-tokens-reset": at(-time.Second)},
			RateLimit{-1, -1, -1, -1, 0, 0, 8000, 0, 0}},
		{"garbage", map[string]string{"input-tokens-limit": "lots", "output-tokens-remaining": "-3", "requests-reset": "soon"},
			RateLimit{-1, -1, -1, -1, 0, 0, -1, -1, 0}},
	} {
		h := http.Header{}
		for k, v := range tc.header {
			h.Set("Anthropic-Ratelimit-"+k, v)
		}
		if got := ParseRateLimit(h, now); got != tc.want {
			t.Errorf("%s: got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}

	for _, tc := range []struct {
		name, usage string
		want        job.Usage
	}{
		{"uncached", `{"input_tokens":120,"output_tokens":30}`, job.Usage{PromptTokens: 120, CompletionTokens: 30, TotalTokens: 150}},
		{"cache write", `{"input_tokens":20,"output_tokens":30,"cache_creation_input_tokens":3000,"cache_read_input_tokens":0}`,
			job.Usage{PromptTokens: 3020, CompletionTokens: 30, TotalTokens: 3050, CacheWriteTokens: 3000}},
		{"cache read", `{"input_tokens":20,"output_tokens":30,"cache_creation_input_tokens":0,"cache_read_input_tokens":3000}`,
			job.Usage{PromptTokens: 3020, CompletionTokens: 30, TotalTokens: 3050, CachedTokens: 3000}},
		{"both", `{"input_tokens":5,"output_tokens":1,"cache_creation_input_tokens":200,"cache_read_input_tokens":3000}`,
			job.Usage{PromptTokens: 3205, CompletionTokens: 1, TotalTokens: 3206, CachedTokens: 3000, CacheWriteTokens: 200}},
	} {
		body, u, err := wire.AnthropicToChat([]byte(`{"type":"message","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":`+tc.usage+`}`), now)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if u != tc.want {
			t.Errorf("%s: usage %+v, want %+v", tc.name, u, tc.want)
		}
		// The OpenAI-shaped answer carries the same usage, for every reader.
		if got := ParseUsage(body); got != tc.want {
			t.Errorf("%s: ParseUsage of the converted answer %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestOpenAIPassesPromptCacheFields: prompt_cache_key and
// prompt_cache_retention reach an OpenAI-kind provider as sent.
func TestOpenAIPassesPromptCacheFields(t *testing.T) {
	t.Parallel()
	got := make(chan []byte, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`))
	}))
	defer srv.Close()
	body := `{"model":"gpt-4o-mini","prompt_cache_key":"tenant-a/agent-7","prompt_cache_retention":"24h","messages":[{"role":"user","content":"hi"}]}`
	if _, err := NewOpenAI(OpenAIConfig{BaseURL: srv.URL}).Do(t.Context(), Call{Body: []byte(body)}); err != nil {
		t.Fatal(err)
	}
	if b := <-got; string(b) != body {
		t.Errorf("provider received %s, want the body as sent", b)
	}
}
