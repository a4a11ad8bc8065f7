package tokens

import (
	"encoding/json"
	"testing"

	"github.com/sluice-dev/sluice/pkg/job"
)

// promptByParts is Prompt as it counted every role, text and name through
// the tokenizer, each time.
func promptByParts(req *job.ChatRequest) int {
	enc, exact := Encoding(req.Model)
	c := codec(enc)
	n := replyPrime
	for _, m := range req.Messages {
		n += perMessage
		if m.Name != "" {
			n += perName
		}
		for _, part := range []string{m.Role, m.Text(), m.Name} {
			k, err := c.Count(part)
			if err != nil {
				k = len(part)/4 + 1
			}
			n += k
		}
	}
	if !exact {
		n = int(float64(n)*FallbackFactor + 0.999)
	}
	return n + Images(req)
}

// Prompt keeps the roles' counts and skips empty parts: it counts what
// counting every part each time counted, for known and unknown roles,
// twice over (the second time from the kept counts).
func TestPromptKeepsRoleCounts(t *testing.T) {
	t.Parallel()
	for _, model := range []string{"gpt-4o-mini", "gpt-4", "claude-sonnet-4"} {
		req := &job.ChatRequest{Model: model, Messages: []job.ChatMessage{
			{Role: "system", Content: json.RawMessage(`"be brief"`)}, {Role: "user", Content: json.RawMessage(`"hi"`), Name: "ann"},
			{Role: "assistant", Content: json.RawMessage(`""`)}, {Role: "tool", Content: json.RawMessage(`null`)},
			{Role: "developer", Content: json.RawMessage(`[{"type":"text","text":"x"}]`)}, {Role: "function"}, {Role: "narrator ünïcode", Content: json.RawMessage(`"y"`)},
		}}
		want := promptByParts(req)
		for round := range 2 {
			if got := Prompt(req); got != want {
				t.Errorf("%s, round %d: Prompt %d, counting every part %d", model, round, got, want)
			}
		}
	}
}
