package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// Token counting: how the simulator counts the prompt it charges and
// reports. A real provider counts with its own tokenizer, never exactly as
// Sluice estimates; by default the simulator does too, so that no test
// passes because the two share a tokenizer.
const (
	// CountChars (the default) counts as an independent provider might:
	// characters (runes) / 4 of each message's role, name and text, plus 4
	// per message and 3 to prime the reply, tool definitions at
	// characters / 4, and images by OpenAI's published rule.
	CountChars = "chars"
	// CountSluice counts with package tokens, Sluice's own estimator: for
	// the few tests that need the provider to agree with it exactly.
	CountSluice = "sluice"
)

const (
	charsPerToken  = 4
	charsPerMsg    = 4
	charsReplyPrim = 3
)

// TokenCount is how the simulator counts prompt (and embeddings input)
// tokens.
type TokenCount struct {
	// Mode is CountChars (default) or CountSluice.
	Mode string
	// Factor scales every count (default 1, in (0, 10]): 1.15 makes the
	// provider count 15 % more, 0.6 40 % less, than Mode alone would.
	Factor float64
}

func (t TokenCount) withDefaults() (TokenCount, error) {
	if t.Mode == "" {
		t.Mode = CountChars
	}
	if t.Factor == 0 {
		t.Factor = 1
	}
	if t.Mode != CountChars && t.Mode != CountSluice {
		return t, fmt.Errorf("token count mode %q: want %q or %q", t.Mode, CountChars, CountSluice)
	}
	if !(t.Factor > 0 && t.Factor <= 10) {
		return t, fmt.Errorf("token count factor %g: want (0, 10]", t.Factor)
	}
	return t, nil
}

func (t TokenCount) scale(n int) int {
	if t.Factor == 1 {
		return n
	}
	return max(int(math.Round(float64(n)*t.Factor)), 1)
}

// charTokens is the character count of s over 4, rounded up.
func charTokens(s string) int {
	return (utf8.RuneCountInString(s) + charsPerToken - 1) / charsPerToken
}

// Prompt counts a chat request's prompt tokens.
func (t TokenCount) Prompt(req *job.ChatRequest) int {
	if t.Mode == CountSluice {
		return t.scale(tokens.Prompt(req))
	}
	n := charsReplyPrim
	for _, m := range req.Messages {
		n += charsPerMsg + charTokens(m.Role) + charTokens(m.Name) + charTokens(m.Text())
	}
	n += charTokens(string(req.Tools))
	return t.scale(n) + tokens.Images(req)
}

// Embeddings counts an embeddings request's input tokens.
func (t TokenCount) Embeddings(req *job.EmbeddingsRequest) int {
	if t.Mode == CountSluice {
		return t.scale(tokens.Embeddings(req))
	}
	n := 0
	for _, s := range req.Texts {
		n += charTokens(s)
	}
	n = t.scale(n)
	for _, ids := range req.Tokens {
		n += len(ids)
	}
	return n
}

// reasoningShare is the part of a reasoning model's completion tokens it
// reports as reasoning tokens (OpenAI counts them inside completion_tokens
// and inside the max_completion_tokens cap).
const reasoningShare = 0.5

// checkReasoning refuses what OpenAI's reasoning models refuse: max_tokens
// ("use max_completion_tokens").
func checkReasoning(body []byte) error {
	var probe struct {
		MaxTokens json.RawMessage `json:"max_tokens"`
	}
	if json.Unmarshal(body, &probe) == nil && len(probe.MaxTokens) > 0 && string(probe.MaxTokens) != "null" {
		return fmt.Errorf("Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.")
	}
	return nil
}

// reasoningTokens is the part of completion tokens a reasoning call
// reports as reasoning.
func (c *call) reasoningTokens(completion int) int {
	if !c.reasoning {
		return 0
	}
	return int(float64(completion) * reasoningShare)
}
