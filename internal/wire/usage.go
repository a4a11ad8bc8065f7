package wire

// ChatUsage is OpenAI's usage object, as a chat.completion and the usage
// chunk of a stream carry it, with Anthropic's cache fields beside it (as
// LiteLLM reports them; /v1/messages answers with them): the one type
// Sluice's own code reads and writes it with. (pkg/job.ChunkUsage is the
// public client's view of the same object.)
type ChatUsage struct {
	PromptTokens            int               `json:"prompt_tokens"`
	CompletionTokens        int               `json:"completion_tokens"`
	TotalTokens             int               `json:"total_tokens"`
	PromptTokensDetails     PromptDetails     `json:"prompt_tokens_details"`
	CompletionTokensDetails CompletionDetails `json:"completion_tokens_details,omitzero"`
	// CacheCreationInputTokens is what an Anthropic provider wrote to its
	// cache (part of PromptTokens); CacheReadInputTokens what it read
	// (PromptTokensDetails.CachedTokens).
	CacheCreationInputTokens int `json:"cache_creation_input_tokens,omitempty"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens,omitempty"`
}

// PromptDetails is usage's prompt_tokens_details.
type PromptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// CompletionDetails is usage's completion_tokens_details.
type CompletionDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

// responses is the usage in the Responses API's shape; nil without usage.
func (c *ChatUsage) responses() *Usage {
	if c == nil {
		return nil
	}
	u := &Usage{InputTokens: c.PromptTokens, OutputTokens: c.CompletionTokens, TotalTokens: c.TotalTokens}
	if u.TotalTokens == 0 {
		u.TotalTokens = u.InputTokens + u.OutputTokens
	}
	u.InputTokensDetails.CachedTokens = c.PromptTokensDetails.CachedTokens
	u.OutputTokensDetails.ReasoningTokens = c.CompletionTokensDetails.ReasoningTokens
	return u
}

// split returns the input tokens as Anthropic counts them: those neither
// read from the cache nor written to it (input_tokens), those read from
// it (cache_read_input_tokens) and those written (cache_creation_input_tokens).
func (c ChatUsage) split() (input, cached, written int) {
	cached = c.PromptTokensDetails.CachedTokens
	written = max(min(c.CacheCreationInputTokens, c.PromptTokens-cached), 0)
	return max(c.PromptTokens-cached-written, 0), cached, written
}
