package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestAzureKind: a provider of kind azure is called on Azure's URLs with
// its api-key header (the simulator's azure profile refuses anything else
// there, and with its key set, OpenAI's paths without the Bearer key), for
// chat, streamed chat and embeddings.
func TestAzureKind(t *testing.T) {
	t.Parallel()
	n := startResponses(t, respBackend{name: "azure", provider: `
  - name: az
    kind: azure
    base_url: %s
    api_key_env: SIM_KEY
    api_version: 2024-10-21
    models:
      - {name: resp-model, rpm: 100000, tpm: 10000000}`,
		sim: sim.Config{Profile: sim.ProfileAzure}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	chat, err := n.sdk.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: respModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}, MaxTokens: openai.Int(16)})
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if len(chat.Choices) == 0 || chat.Usage.TotalTokens == 0 {
		t.Errorf("chat: %d choices, usage %d; want an answer with usage", len(chat.Choices), chat.Usage.TotalTokens)
	}
	stream := n.sdk.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: respModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}, MaxTokens: openai.Int(16)})
	chunks := 0
	for stream.Next() {
		chunks++
	}
	if err := stream.Err(); err != nil || chunks == 0 {
		t.Errorf("streamed chat: %d chunks, err %v", chunks, err)
	}
	emb, err := n.sdk.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: respModel,
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hello")}})
	if err != nil || len(emb.Data) == 0 {
		t.Fatalf("embeddings: %v", err)
	}
	for path, want := range map[string]int{
		sim.AzurePathPrefix + respModel + "/chat/completions": 2,
		sim.AzurePathPrefix + respModel + "/embeddings":       1,
	} {
		if got := len(simRequests(path)(n.sim)); got != want {
			t.Errorf("%s: %d calls, want %d", path, got, want)
		}
	}
}
