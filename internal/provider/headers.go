package provider

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	jsonv1 "github.com/go-json-experiment/json/v1"

	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/job"
)

// maxHint caps any wait a provider asks for, so absurd header values cannot
// overflow a time.Duration. A day is far past every deadline Sluice handles.
const maxHint = 24 * time.Hour

// maxUsage bounds each token count ParseUsage reports (a billion tokens:
// far above any context window).
const maxUsage = 1 << 30

// ParseRetryAfter reads how long the provider asks us to wait.
// "retry-after-ms" (float milliseconds) wins; then "Retry-After" as seconds
// (integer or float) or an HTTP-date. Absent, garbage, negative or past
// values give 0. Values are capped at 24h.
func ParseRetryAfter(h http.Header, now time.Time) time.Duration {
	if h == nil {
		return 0
	}
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, ok := parseFloat(v); ok && ms > 0 {
			return clampHint(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, ok := parseFloat(v); ok {
		if s <= 0 {
			return 0
		}
		return clampHint(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return min(d, maxHint)
		}
	}
	return 0
}

// parseFloat parses a finite decimal number.
func parseFloat(s string) (float64, bool) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// clampHint converts nanoseconds to a Duration in [0, maxHint].
func clampHint(ns float64) time.Duration {
	if ns <= 0 {
		return 0
	}
	if ns >= float64(maxHint) {
		return maxHint
	}
	return time.Duration(ns)
}

// RateLimit is what the provider's rate-limit headers said. Counts are -1
// and resets 0 when absent.
type RateLimit struct {
	LimitRequests, LimitTokens, RemainingRequests, RemainingTokens int
	ResetRequests, ResetTokens                                     time.Duration
	// LimitOutput, RemainingOutput and ResetOutput are Anthropic's output
	// tokens (anthropic-ratelimit-output-tokens-*), limited apart from the
	// input; the Tokens fields are then its input tokens.
	LimitOutput, RemainingOutput int
	ResetOutput                  time.Duration
}

// ParseRateLimit reads OpenAI-style x-ratelimit-* headers (resets like "1s",
// "6m0s", "120ms", "1m30.5s", also bare seconds and a leading "Nd") and
// Anthropic anthropic-ratelimit-* headers (resets are RFC 3339 times,
// converted to a duration from now). Anthropic limits input and output
// tokens apart: the Tokens fields read its input-tokens headers, falling
// back to the combined "tokens" ones (the most restrictive token limit in
// effect), and the Output fields its output-tokens headers.
func ParseRateLimit(h http.Header, now time.Time) RateLimit {
	rl := RateLimit{LimitRequests: -1, LimitTokens: -1, RemainingRequests: -1, RemainingTokens: -1, LimitOutput: -1, RemainingOutput: -1}
	if h == nil {
		return rl
	}
	count := func(names ...string) int { return headerCount(h, names...) }
	reset := func(openai string, anthropic ...string) time.Duration {
		if v := strings.TrimSpace(h.Get(openai)); v != "" {
			if d, ok := parseResetDuration(v); ok {
				return d
			}
		}
		for _, n := range anthropic {
			if v := strings.TrimSpace(h.Get(n)); v != "" {
				if t, err := time.Parse(time.RFC3339, v); err == nil {
					return max(0, min(t.Sub(now), maxHint))
				}
			}
		}
		return 0
	}
	rl.LimitRequests = count("X-Ratelimit-Limit-Requests", "Anthropic-Ratelimit-Requests-Limit")
	rl.LimitTokens = count("X-Ratelimit-Limit-Tokens", "Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Limit")
	rl.RemainingRequests = count("X-Ratelimit-Remaining-Requests", "Anthropic-Ratelimit-Requests-Remaining")
	rl.RemainingTokens = count("X-Ratelimit-Remaining-Tokens", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Remaining")
	rl.ResetRequests = reset("X-Ratelimit-Reset-Requests", "Anthropic-Ratelimit-Requests-Reset")
	rl.ResetTokens = reset("X-Ratelimit-Reset-Tokens", "Anthropic-Ratelimit-Input-Tokens-Reset", "Anthropic-Ratelimit-Tokens-Reset")
	rl.LimitOutput = count("Anthropic-Ratelimit-Output-Tokens-Limit")
	rl.RemainingOutput = count("Anthropic-Ratelimit-Output-Tokens-Remaining")
	rl.ResetOutput = reset("", "Anthropic-Ratelimit-Output-Tokens-Reset")
	return rl
}

// headerCount returns the first of the named headers that holds a
// non-negative count (an integer, or a finite number below 2^31, truncated);
// -1 when none does.
func headerCount(h http.Header, names ...string) int {
	for _, n := range names {
		if v := strings.TrimSpace(h.Get(n)); v != "" {
			if i, err := strconv.Atoi(v); err == nil && i >= 0 {
				return i
			}
			if f, ok := parseFloat(v); ok && f >= 0 && f < math.MaxInt32 {
				return int(f)
			}
		}
	}
	return -1
}

// parseResetDuration parses OpenAI reset values: Go-style durations ("6m0s",
// "1m30.5s", "120ms"), an optional leading day count ("1d2h"), or bare
// seconds ("0.5").
func parseResetDuration(v string) (time.Duration, bool) {
	if s, ok := parseFloat(v); ok {
		if s < 0 {
			return 0, false
		}
		return clampHint(s * float64(time.Second)), true
	}
	if i := strings.IndexByte(v, 'd'); i > 0 {
		n, err := strconv.Atoi(v[:i])
		if err != nil || n < 0 {
			return 0, false
		}
		rest := v[i+1:]
		if rest != "" {
			if _, err := time.ParseDuration(rest); err != nil {
				return 0, false
			}
		}
		if n > 0 {
			return maxHint, true // a day or more: at the cap
		}
		if rest == "" {
			return 0, true
		}
		v = rest
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, false
	}
	return min(d, maxHint), true
}

// ParseUsage reads token usage from a chat.completion body (OpenAI shape,
// which is also what the Anthropic client returns). A body without usage
// gives zeros. TotalTokens is computed when the provider omits it.
func ParseUsage(body []byte) job.Usage {
	u, _ := ParseAnswer(body)
	return u
}

// Answer is what a trace reads of a chat.completion besides its usage:
// its id, model and finish reasons; never its content.
type Answer struct {
	ID, Model     string
	FinishReasons []string
}

// ParseAnswer is ParseUsage with the answer's id, model and finish
// reasons, read in the same pass over the body.
func ParseAnswer(body []byte) (job.Usage, Answer) {
	var v struct {
		ID      string          `json:"id"`
		Model   string          `json:"model"`
		Choices []answerChoice  `json:"choices"`
		Usage   *wire.ChatUsage `json:"usage"`
	}
	if jsonv1.Unmarshal(body, &v) != nil {
		return job.Usage{}, Answer{}
	}
	a := Answer{ID: v.ID, Model: v.Model}
	for _, c := range v.Choices {
		if c.FinishReason != "" {
			a.FinishReasons = append(a.FinishReasons, c.FinishReason)
		}
	}
	if v.Usage == nil {
		return job.Usage{}, a
	}
	return usageOf(v.Usage), a
}

type answerChoice struct {
	FinishReason string `json:"finish_reason"`
}

// usageOf is a provider's usage as Sluice counts it.
func usageOf(w *wire.ChatUsage) job.Usage {
	// The provider's answer is input too: a negative or absurd count must
	// not panic a counter or return budget that was never taken.
	clamp := func(n int) int { return min(max(n, 0), maxUsage) }
	u := job.Usage{PromptTokens: clamp(w.PromptTokens), CompletionTokens: clamp(w.CompletionTokens), TotalTokens: clamp(w.TotalTokens)}
	u.CachedTokens = min(clamp(w.PromptTokensDetails.CachedTokens), u.PromptTokens)
	// Reasoning tokens are output tokens (inside completion_tokens as
	// OpenAI reports them).
	u.ReasoningTokens = clamp(w.CompletionTokensDetails.ReasoningTokens)
	u.CompletionTokens = max(u.CompletionTokens, u.ReasoningTokens)
	u.CacheWriteTokens = min(clamp(w.CacheCreationInputTokens), u.PromptTokens-u.CachedTokens)
	if u.TotalTokens < u.PromptTokens+u.CompletionTokens {
		u.TotalTokens = u.PromptTokens + u.CompletionTokens
	}
	return u
}
