package sim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
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

// headerForm is which x-ratelimit-* headers a simulator sends.
type headerForm int

const (
	headersOpenAI headerForm = iota // limit, remaining and reset of requests and tokens
	headersAzure                    // remaining requests and tokens only
	headersNone
)

func formOf(c Config) headerForm {
	switch {
	case c.NoRateHeaders:
		return headersNone
	case c.Profile == ProfileAzure:
		return headersAzure
	}
	return headersOpenAI
}

// set writes the x-ratelimit-* headers of the limited dimensions in form f.
// Keys are assigned in canonical form directly: Header.Set would
// canonicalize (and allocate) on every response.
func (r rateHeaders) set(h http.Header, f headerForm) {
	if f == headersNone {
		return
	}
	if r.rpm > 0 {
		h["X-Ratelimit-Remaining-Requests"] = []string{strconv.FormatInt(r.remReqs, 10)}
		if f == headersOpenAI {
			h["X-Ratelimit-Limit-Requests"] = []string{strconv.FormatInt(r.rpm, 10)}
			h["X-Ratelimit-Reset-Requests"] = []string{formatDuration(r.resetReqs)}
		}
	}
	if r.tpm > 0 {
		h["X-Ratelimit-Remaining-Tokens"] = []string{strconv.FormatInt(r.remToks, 10)}
		if f == headersOpenAI {
			h["X-Ratelimit-Limit-Tokens"] = []string{strconv.FormatInt(r.tpm, 10)}
			h["X-Ratelimit-Reset-Tokens"] = []string{formatDuration(r.resetTk)}
		}
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

// rateLimitError is the 429 body for a rejected arrival under limits l;
// hidden leaves every number out of the message.
func rateLimitError(model string, d decision, l limits, hidden bool) apiError {
	e := apiError{Type: d.reason.kind(), Code: "rate_limit_exceeded"}
	switch {
	case d.tooLarge && hidden:
		e.Type = "tokens"
		e.Message = "Request too large. The input or output tokens must be reduced in order to run successfully."
	case d.tooLarge:
		e.Type = "tokens"
		e.Message = fmt.Sprintf("Request too large for %s in organization %s on tokens per min (TPM): Limit %d, Requested %d. The input or output tokens must be reduced in order to run successfully.",
			model, organization, d.limit, d.requested)
	case hidden:
		e.Message = "Rate limit reached. Please try again later."
	default:
		e.Message = fmt.Sprintf("Rate limit reached for %s in organization %s on %s. Please try again in %s.",
			model, organization, l.explain(d), formatDuration(max(d.retry, time.Millisecond)))
	}
	return e
}

// explain names the limit a rejection hit, with its numbers, the way
// OpenAI's messages do ("requests per min (RPM): Limit 3, Used 3,
// Requested 1").
func (l limits) explain(d decision) string {
	c := d.reason
	name, abbr := "requests", "RPM"
	if c.tokens() {
		name, abbr = "tokens", "TPM"
	}
	requested := c.amount(d.requested)
	switch c {
	case rpmShort, tpmShort:
		span := "second"
		if l.short != winSecond {
			span = fmt.Sprintf("%gs", l.short.seconds())
		}
		return fmt.Sprintf("%s per %s (%s quantized to %gs): Limit %d, Used %d, Requested %d",
			name, span, abbr, l.short.seconds(), d.limit, d.used, requested)
	case rpmBucket, tpmBucket:
		return fmt.Sprintf("%s per min (%s), a bucket refilled at %s/60 per second: Capacity %s, Used %s, Requested %d",
			name, abbr, abbr, bucketAmount(d.limit), bucketAmount(d.used), requested)
	case rpmRamp, tpmRamp:
		return fmt.Sprintf("the acceleration limit of %s per min (%s): Limit %d, Used %d, Requested %d in the last 10s, at most %gx the 10s before; increase usage gradually",
			name, abbr, d.limit, d.used, requested, l.growth)
	}
	return fmt.Sprintf("%s per min (%s): Limit %d, Used %d, Requested %d", name, abbr, d.limit, d.used, requested)
}

// bucketAmount formats bucket units as requests or tokens, to 3 decimals.
func bucketAmount(u int64) string {
	return strconv.FormatFloat(math.Round(float64(u)/unitsPerToken*1000)/1000, 'f', -1, 64)
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
	Content     *string         `json:"content"`
	ToolCalls   []chatToolCall  `json:"tool_calls,omitempty"`
	Refusal     json.RawMessage `json:"refusal"`
	Annotations []struct{}      `json:"annotations"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type usage struct {
	PromptTokens            int            `json:"prompt_tokens"`
	CompletionTokens        int            `json:"completion_tokens"`
	TotalTokens             int            `json:"total_tokens"`
	PromptTokensDetails     map[string]int `json:"prompt_tokens_details"`
	CompletionTokensDetails map[string]int `json:"completion_tokens_details"`
}

// newCompletion builds the response to a completed call: n choices of
// completionTokens each.
func (s *Server) newCompletion(c *call, completionTokens int, created time.Time) chatCompletion {
	finish := "stop"
	if completionTokens >= c.maxOut {
		finish = "length"
	}
	null := json.RawMessage("null")
	n := max(c.n, 1)
	choices := make([]choice, n)
	for i := range choices {
		text := s.filler.text(completionTokens) + strings.Repeat(".", s.cfg.PadResponseBytes)
		f := finish
		if c.content != nil {
			text, f = *c.content, "stop"
		}
		msg := message{Role: "assistant", Content: &text, Refusal: null, Annotations: []struct{}{}}
		if t := c.tool; t != nil {
			msg.Content, f = nil, "tool_calls"
			msg.ToolCalls = []chatToolCall{{ID: t.id, Type: "function", Function: chatFunction{Name: t.name, Arguments: t.args}}}
		}
		choices[i] = choice{Index: i, Message: msg, Logprobs: null, FinishReason: f}
	}
	return chatCompletion{
		ID:      "chatcmpl-" + randomID(24),
		Object:  "chat.completion",
		Created: created.Unix(),
		Model:   c.model,
		Choices: choices,
		Usage: usage{
			PromptTokens:            c.prompt,
			CompletionTokens:        n * completionTokens,
			TotalTokens:             c.prompt + n*completionTokens,
			PromptTokensDetails:     map[string]int{"cached_tokens": 0, "audio_tokens": 0},
			CompletionTokensDetails: map[string]int{"reasoning_tokens": c.reasoningTokens(n * completionTokens), "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
		},
		ServiceTier:       "default",
		SystemFingerprint: "fp_sluice_sim",
	}
}

// EmbeddingDimensions is the length of the simulator's vectors when a
// request names no dimensions.
const EmbeddingDimensions = 64

// embeddingList is OpenAI's embeddings response.
type embeddingList struct {
	Object string      `json:"object"`
	Data   []embedding `json:"data"`
	Model  string      `json:"model"`
	Usage  struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

type embedding struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string of little-endian float32s
}

// newEmbeddings builds the response to a completed embeddings call: one
// unit vector per input, fixed by the input's hash.
func newEmbeddings(c *call) embeddingList {
	req := c.embed
	dims := EmbeddingDimensions
	if req.Dimensions != nil {
		dims = min(*req.Dimensions, 4096)
	}
	out := embeddingList{Object: "list", Model: c.model, Data: make([]embedding, 0, req.Inputs())}
	vec := func(i int, seed []byte) {
		h := fnv64(seed)
		v := make([]float32, dims)
		var norm float64
		for k := range v {
			h ^= h << 13
			h ^= h >> 7
			h ^= h << 17
			v[k] = float32(int64(h%2001)-1000) / 1000
			norm += float64(v[k]) * float64(v[k])
		}
		if norm > 0 {
			for k := range v {
				v[k] = float32(float64(v[k]) / math.Sqrt(norm))
			}
		}
		var e any = v
		if req.EncodingFormat == "base64" {
			b := make([]byte, 4*dims)
			for k, f := range v {
				binary.LittleEndian.PutUint32(b[4*k:], math.Float32bits(f))
			}
			e = base64.StdEncoding.EncodeToString(b)
		}
		out.Data = append(out.Data, embedding{Object: "embedding", Index: i, Embedding: e})
	}
	for i, t := range req.Texts {
		vec(i, []byte(t))
	}
	for i, ids := range req.Tokens {
		vec(i, []byte(fmt.Sprint(ids)))
	}
	out.Usage.PromptTokens, out.Usage.TotalTokens = c.prompt, c.prompt
	return out
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
