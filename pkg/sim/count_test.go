package sim_test

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// usageOf reads a completion's usage.
func usageOf(t *testing.T, r reply) (prompt, completion, reasoning int) {
	t.Helper()
	var out struct {
		Usage struct {
			PromptTokens            int `json:"prompt_tokens"`
			CompletionTokens        int `json:"completion_tokens"`
			CompletionTokensDetails struct {
				ReasoningTokens int `json:"reasoning_tokens"`
			} `json:"completion_tokens_details"`
		} `json:"usage"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &out) != nil {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	u := out.Usage
	return u.PromptTokens, u.CompletionTokens, u.CompletionTokensDetails.ReasoningTokens
}

// By default the simulator counts as an independent provider would:
// characters/4 plus its own framing, not Sluice's tokenizer; Factor scales
// it.
func TestDefaultCountIsNotSluices(t *testing.T) {
	t.Parallel()
	text := strings.Repeat("The quick brown fox jumps over the lazy dog near the riverbank. ", 40)
	b := body(model, text, 10)
	req, err := job.ParseRequest([]byte(b), job.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	// 3 to prime + 4 for the message + "user" (1) + the text's characters / 4.
	want := 3 + 4 + 1 + (len(text)+3)/4
	for _, tc := range []struct {
		count sim.TokenCount
		want  int
	}{
		{sim.TokenCount{}, want},
		{sim.TokenCount{Factor: 1.15}, int(float64(want)*1.15 + 0.5)},
		{sim.TokenCount{Factor: 0.6}, int(float64(want)*0.6 + 0.5)},
		{sim.TokenCount{Mode: sim.CountSluice}, tokens.Prompt(req)},
	} {
		s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model}}, Count: tc.count}) // not start: it picks a count
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(s.Handler())
		got, _, _ := usageOf(t, chat(t, ts.URL, b))
		ts.Close()
		if got != tc.want {
			t.Errorf("count %+v: prompt_tokens %d, want %d", tc.count, got, tc.want)
		}
	}
	if est := tokens.Prompt(req); est == want {
		t.Errorf("the default count (%d) equals Sluice's estimate: the test text no longer tells them apart", want)
	}
	if _, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model}}, Count: sim.TokenCount{Mode: "bpe"}}); err == nil {
		t.Error("an unknown count mode was accepted")
	}
}

// A reasoning model refuses max_tokens, takes max_completion_tokens as it
// was sent, and reports reasoning tokens inside the completion tokens.
func TestReasoningModel(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var bodies []string
	_, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: "o4-mini", Reasoning: true}},
		OnArrival: func(a sim.Arrival) { mu.Lock(); bodies = append(bodies, string(a.Body)); mu.Unlock() }})
	r := chat(t, url, `{"model":"o4-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`)
	if r.status != 400 || !strings.Contains(string(r.body), "max_completion_tokens") {
		t.Errorf("max_tokens on a reasoning model: status %d %s, want 400 naming max_completion_tokens", r.status, r.body)
	}
	sent := `{"model":"o4-mini","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":400}`
	_, completion, reasoning := usageOf(t, chat(t, url, sent))
	if reasoning <= 0 || reasoning >= completion {
		t.Errorf("usage: completion %d, reasoning %d; want reasoning tokens inside the completion tokens", completion, reasoning)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 || bodies[0] != sent {
		t.Errorf("the simulator recorded %q, want the body as sent", bodies)
	}
}

// Images count by OpenAI's rule in the simulator too.
func TestSimCountsImages(t *testing.T) {
	t.Parallel()
	_, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}, Count: sim.TokenCount{Mode: sim.CountChars}})
	text, _, _ := usageOf(t, chat(t, url, `{"model":"gpt-4o-mini","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`))
	got, _, _ := usageOf(t, chat(t, url, `{"model":"gpt-4o-mini","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"https://example.test/a.png","detail":"low"}}]}]}`))
	if got != text+tokens.ImageBaseTokens {
		t.Errorf("prompt with a low-detail image: %d, want %d + %d", got, text, tokens.ImageBaseTokens)
	}
}
