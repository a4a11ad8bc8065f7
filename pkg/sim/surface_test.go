package sim_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// Embeddings are charged their input tokens against the model's TPM like
// chat, answered with one vector per input, and refused with a 429 beyond
// the limit.
func TestEmbeddingsCharged(t *testing.T) {
	t.Parallel()
	clk := newClock()
	const emb = "text-embedding-3-small"
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: emb, TPM: 30}}, BurstFraction: 1, Now: clk.Now})
	inputs := []string{"hello world", "tiktoken is great!"} // 2 + 6 tokens in cl100k_base
	payload, _ := json.Marshal(map[string]any{"model": emb, "input": inputs, "dimensions": 8, "encoding_format": "base64"})
	r := do(t, http.MethodPost, url+"/v1/embeddings", string(payload))
	wantStatus(t, r, http.StatusOK)
	var resp struct {
		Data []struct {
			Index     int    `json:"index"`
			Embedding string `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(r.body, &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Data) != 2 || resp.Data[1].Index != 1 || resp.Usage.PromptTokens != 8 {
		t.Fatalf("embeddings %s: want 2 vectors and 8 prompt tokens", r.body)
	}
	if raw, err := base64.StdEncoding.DecodeString(resp.Data[0].Embedding); err != nil || len(raw) != 8*4 {
		t.Errorf("base64 embedding: %d bytes, %v; want 8 float32s", len(raw), err)
	}
	if got := tokens.Embeddings(&job.EmbeddingsRequest{Model: emb, Texts: inputs}); got != 8 {
		t.Errorf("tokens.Embeddings = %d, want 8", got)
	}
	// 8 + 8 + 8 fits 30 tokens; a fourth does not.
	for range 2 {
		clk.Advance(time.Second)
		wantStatus(t, do(t, http.MethodPost, url+"/v1/embeddings", string(payload)), http.StatusOK)
	}
	clk.Advance(time.Second)
	r = do(t, http.MethodPost, url+"/embeddings", string(payload))
	wantStatus(t, r, http.StatusTooManyRequests)
	if r.header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	ms := s.Stats().Models[emb]
	if ms.ChargedTokens != 24 || ms.Admitted != 3 || ms.RateLimited != 1 {
		t.Errorf("model stats: charged %d, admitted %d, refused %d; want 24, 3, 1", ms.ChargedTokens, ms.Admitted, ms.RateLimited)
	}
}

// n = 3 answers three choices and is charged prompt + 3 x max_tokens.
func TestChatChoices(t *testing.T) {
	t.Parallel()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, TPM: 100000}}})
	var req map[string]any
	_ = json.Unmarshal([]byte(body(model, "hi", 50)), &req)
	req["n"] = 3
	payload, _ := json.Marshal(req)
	r := do(t, http.MethodPost, url+"/v1/chat/completions", string(payload))
	wantStatus(t, r, http.StatusOK)
	var resp struct {
		Choices []struct {
			Index int `json:"index"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(r.body, &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 3 || resp.Choices[2].Index != 2 || resp.Usage.CompletionTokens%3 != 0 {
		t.Errorf("n=3: %s; want three choices and completion tokens a multiple of 3", r.body)
	}
	pr, _ := job.ParseRequest(payload, job.Limits{})
	if got, want := s.Stats().Models[model].ChargedTokens, int64(tokens.Prompt(pr)+3*50); got != want {
		t.Errorf("charged %d tokens, want %d (prompt + 3 x 50)", got, want)
	}
}
