package sim

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// apiError is the body of OpenAI's error responses. Param and Code are
// serialized as null when empty.
type apiError struct {
	Message string
	Type    string
	Param   string
	Code    string
}

func (e apiError) MarshalJSON() ([]byte, error) {
	type wire struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	return json.Marshal(map[string]wire{"error": {e.Message, e.Type, nullable(e.Param), nullable(e.Code)}})
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil { // only our own types are written
		panic(fmt.Sprintf("sim: encoding response: %v", err))
	}
	writeBody(w, status, body)
}

func writeBody(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// set writes the x-ratelimit-* headers of the limited dimensions. Keys are
// assigned in canonical form directly: Header.Set would canonicalize (and
// allocate) on every response.
func (r rateHeaders) set(h http.Header) {
	if r.rpm > 0 {
		h["X-Ratelimit-Limit-Requests"] = []string{strconv.FormatInt(r.rpm, 10)}
		h["X-Ratelimit-Remaining-Requests"] = []string{strconv.FormatInt(r.remReqs, 10)}
		h["X-Ratelimit-Reset-Requests"] = []string{formatDuration(r.resetReqs)}
	}
	if r.tpm > 0 {
		h["X-Ratelimit-Limit-Tokens"] = []string{strconv.FormatInt(r.tpm, 10)}
		h["X-Ratelimit-Remaining-Tokens"] = []string{strconv.FormatInt(r.remToks, 10)}
		h["X-Ratelimit-Reset-Tokens"] = []string{formatDuration(r.resetTk)}
	}
}

// formatDuration formats d as OpenAI does ("1s", "6m0s", "120ms", "1.2s"):
// Go's format after rounding up to a whole millisecond.
func formatDuration(d time.Duration) string {
	return ceilMS(d).String()
}

func ceilMS(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

// setRetryAfter writes Retry-After (whole seconds, rounded up, >= 1) and
// retry-after-ms (rounded up, >= 1).
func setRetryAfter(h http.Header, d time.Duration) {
	ms := max(ceilMS(d).Milliseconds(), 1)
	h["Retry-After"] = []string{strconv.FormatInt(max((ms+999)/1000, 1), 10)}
	h["Retry-After-Ms"] = []string{strconv.FormatInt(ms, 10)}
}

// rateLimitError is the 429 body for a rejected arrival.
func rateLimitError(model string, d decision) apiError {
	if d.tooLarge {
		return apiError{
			Message: fmt.Sprintf("Request too large for %s in organization %s on tokens per min (TPM): Limit %d, Requested %d. The input or output tokens must be reduced in order to run successfully.",
				model, organization, d.limit, d.requested),
			Type: "tokens",
			Code: "rate_limit_exceeded",
		}
	}
	requested := d.requested
	if d.reason.dim() == dimReqs {
		requested = 1
	}
	return apiError{
		Message: fmt.Sprintf("Rate limit reached for %s in organization %s on %s: Limit %d, Used %d, Requested %d. Please try again in %s.",
			model, organization, d.reason.describe(), d.limit, d.used, requested, formatDuration(max(d.retry, time.Millisecond))),
		Type: d.reason.kind(),
		Code: "rate_limit_exceeded",
	}
}

// organization is the organization named in rate-limit messages.
const organization = "org-sluice-sim"

// chatCompletion is OpenAI's chat.completion object.
type chatCompletion struct {
	ID                string   `json:"id"`
	Object            string   `json:"object"`
	Created           int64    `json:"created"`
	Model             string   `json:"model"`
	Choices           []choice `json:"choices"`
	Usage             usage    `json:"usage"`
	ServiceTier       string   `json:"service_tier"`
	SystemFingerprint string   `json:"system_fingerprint"`
}

type choice struct {
	Index        int             `json:"index"`
	Message      message         `json:"message"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

type message struct {
	Role        string          `json:"role"`
	Content     string          `json:"content"`
	Refusal     json.RawMessage `json:"refusal"`
	Annotations []struct{}      `json:"annotations"`
}

type usage struct {
	PromptTokens            int            `json:"prompt_tokens"`
	CompletionTokens        int            `json:"completion_tokens"`
	TotalTokens             int            `json:"total_tokens"`
	PromptTokensDetails     map[string]int `json:"prompt_tokens_details"`
	CompletionTokensDetails map[string]int `json:"completion_tokens_details"`
}

// newCompletion builds the response to a completed call.
func (s *Server) newCompletion(c *call, completionTokens int, created time.Time) chatCompletion {
	finish := "stop"
	if completionTokens >= c.maxOut {
		finish = "length"
	}
	null := json.RawMessage("null")
	return chatCompletion{
		ID:      "chatcmpl-" + randomID(24),
		Object:  "chat.completion",
		Created: created.Unix(),
		Model:   c.model,
		Choices: []choice{{
			Message:      message{Role: "assistant", Content: s.filler.text(completionTokens), Refusal: null, Annotations: []struct{}{}},
			Logprobs:     null,
			FinishReason: finish,
		}},
		Usage: usage{
			PromptTokens:            c.prompt,
			CompletionTokens:        completionTokens,
			TotalTokens:             c.prompt + completionTokens,
			PromptTokensDetails:     map[string]int{"cached_tokens": 0, "audio_tokens": 0},
			CompletionTokensDetails: map[string]int{"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
		},
		ServiceTier:       "default",
		SystemFingerprint: "fp_sluice_sim",
	}
}

const idAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// randomID returns n random alphanumerics (not secret: ids only need to be
// distinct).
func randomID(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = idAlphabet[rand.IntN(len(idAlphabet))]
	}
	return string(b)
}

// filler is deterministic assistant text, about one token per word.
type filler struct {
	text0 string // fillerWords words
	ends  []int  // ends[i] is the length of the first i+1 words
}

const fillerWords = 4096

func newFiller() filler {
	words := strings.Fields("The simulated provider returns this deterministic filler text so that tests see a realistic reply without any of the prompt being echoed back to the caller")
	var b strings.Builder
	f := filler{ends: make([]int, fillerWords)}
	for i := range fillerWords {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[i%len(words)])
		f.ends[i] = b.Len()
	}
	f.text0 = b.String()
	return f
}

// text returns the first n words of filler, repeating it past fillerWords.
func (f filler) text(n int) string {
	if n <= 0 {
		return ""
	}
	if n <= fillerWords {
		return f.text0[:f.ends[n-1]]
	}
	var b strings.Builder
	for n > fillerWords {
		b.WriteString(f.text0)
		b.WriteByte(' ')
		n -= fillerWords
	}
	b.WriteString(f.text(n))
	return b.String()
}
