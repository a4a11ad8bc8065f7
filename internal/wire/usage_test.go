package wire

import (
	"encoding/json"
	"testing"
)

// TestChatUsageJSON: the one usage type writes what the three it replaced
// wrote (prompt_tokens_details always, Anthropic's cache fields and
// completion_tokens_details only when set) and reads either shape.
func TestChatUsageJSON(t *testing.T) {
	t.Parallel()
	u := ChatUsage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}
	u.PromptTokensDetails.CachedTokens = 4
	b, _ := json.Marshal(u)
	if want := `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}}`; string(b) != want {
		t.Errorf("marshal: %s, want %s", b, want)
	}
	u.CompletionTokensDetails.ReasoningTokens = 2
	u.CacheCreationInputTokens, u.CacheReadInputTokens = 3, 4
	b, _ = json.Marshal(u)
	if want := `{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2},"cache_creation_input_tokens":3,"cache_read_input_tokens":4}`; string(b) != want {
		t.Errorf("marshal: %s, want %s", b, want)
	}
	var back ChatUsage
	if err := json.Unmarshal([]byte(`{"prompt_tokens":7,"completion_tokens":1,"prompt_tokens_details":null}`), &back); err != nil || back.PromptTokens != 7 || back.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("unmarshal without details: %+v %v", back, err)
	}
	if in, cached, written := u.split(); in != 3 || cached != 4 || written != 3 {
		t.Errorf("split: %d %d %d, want 3 4 3", in, cached, written)
	}
	if r := (*ChatUsage)(nil).responses(); r != nil {
		t.Errorf("no usage: %+v, want nil", r)
	}
}
