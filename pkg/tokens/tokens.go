// Package tokens estimates the prompt tokens of a chat-completions request
// and the input tokens of an embeddings request.
//
// OpenAI-family models (gpt-4o, gpt-4.1, gpt-5, o-series, gpt-4, gpt-3.5) are
// counted with their real BPE (o200k_base or cl100k_base, compiled into the
// binary: nothing is downloaded at run time) plus OpenAI's documented chat
// framing: 3 tokens per message, 1 more for a name, 3 to prime the reply.
// OpenAI's embedding models (text-embedding-3-*, text-embedding-ada-002)
// are counted with cl100k_base, input by input, with no framing.
// Any other model is counted with o200k_base as a proxy and multiplied by
// FallbackFactor (1.15): other vendors' tokenizers tend to produce more tokens
// for the same text, and over-estimating costs throughput while
// under-estimating costs 429s.
package tokens

import (
	"encoding/json"
	"strings"
	"sync"

	"github.com/tiktoken-go/tokenizer"

	"github.com/sluice-dev/sluice/pkg/job"
)

// FallbackFactor scales the proxy count for models without a known tokenizer.
const FallbackFactor = 1.15

const (
	perMessage = 3
	perName    = 1
	replyPrime = 3
)

var (
	mu     sync.Mutex
	codecs = map[tokenizer.Encoding]tokenizer.Codec{}
)

func codec(enc tokenizer.Encoding) tokenizer.Codec {
	mu.Lock()
	defer mu.Unlock()
	c, ok := codecs[enc]
	if !ok {
		var err error
		c, err = tokenizer.Get(enc)
		if err != nil {
			panic("tokens: built-in encoding missing: " + string(enc))
		}
		codecs[enc] = c
	}
	return c
}

// roles are the chat roles whose token counts are kept once counted:
// every message names one, and the tokenizer allocates at each count.
var roles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true}

// roleCounts holds the count of each role under each encoding.
var roleCounts sync.Map // roleKey -> int

type roleKey struct {
	enc  tokenizer.Encoding
	role string
}

// roleTokens counts a message's role under enc (c): a known role once per
// encoding, any other each time.
func roleTokens(enc tokenizer.Encoding, c tokenizer.Codec, role string) int {
	if role == "" {
		return 0
	}
	if n, ok := roleCounts.Load(roleKey{enc, role}); ok {
		return n.(int)
	}
	n, counted := tokensOf(c, role)
	if roles[role] && counted {
		roleCounts.Store(roleKey{enc, role}, n)
	}
	return n
}

// tokensOf counts text under c or, where c refuses it, estimates a token
// per four bytes (counted false).
func tokensOf(c tokenizer.Codec, text string) (n int, counted bool) {
	n, err := c.Count(text)
	if err != nil {
		return len(text)/4 + 1, false
	}
	return n, true
}

// Warm loads the encodings models are counted with, so that the first
// request for each does not wait for its tokenizer to load (tens of
// milliseconds).
func Warm(models ...string) {
	for _, m := range models {
		enc, _ := Encoding(m)
		_, _ = codec(enc).Count("warm")
	}
}

// Encoding returns the BPE encoding used for model and whether it is the
// model's own (exact) or a proxy.
func Encoding(model string) (tokenizer.Encoding, bool) {
	m := strings.ToLower(model)
	if i := strings.LastIndex(m, "/"); i >= 0 { // "openai/gpt-4o" style names
		m = m[i+1:]
	}
	switch {
	case strings.HasPrefix(m, "gpt-4o"), strings.HasPrefix(m, "gpt-4.1"), strings.HasPrefix(m, "gpt-5"),
		strings.HasPrefix(m, "o1"), strings.HasPrefix(m, "o3"), strings.HasPrefix(m, "o4"),
		strings.HasPrefix(m, "chatgpt-4o"), strings.HasPrefix(m, "gpt-oss"):
		return tokenizer.O200kBase, true
	case strings.HasPrefix(m, "gpt-4"), strings.HasPrefix(m, "gpt-3.5"), strings.HasPrefix(m, "gpt-35"),
		strings.HasPrefix(m, "text-embedding-3"), strings.HasPrefix(m, "text-embedding-ada-002"):
		return tokenizer.Cl100kBase, true
	}
	return tokenizer.O200kBase, false
}

// Count returns the number of tokens in text under model's encoding (no
// fallback factor applied).
func Count(model, text string) int {
	enc, _ := Encoding(model)
	n, _ := tokensOf(codec(enc), text)
	return n
}

// Prompt estimates the prompt tokens of a chat request.
func Prompt(req *job.ChatRequest) int {
	enc, exact := Encoding(req.Model)
	c := codec(enc)
	n := replyPrime
	for _, m := range req.Messages {
		n += perMessage
		if m.Name != "" {
			n += perName
		}
		n += roleTokens(enc, c, m.Role)
		for _, part := range []string{m.Text(), m.Name} {
			if part == "" {
				continue // no token
			}
			k, _ := tokensOf(c, part)
			n += k
		}
	}
	if len(req.Tools) > 0 {
		k, _ := c.Count(string(req.Tools))
		n += k
	}
	n += nativeOnly(c, req.Native)
	if !exact {
		n = int(float64(n)*FallbackFactor + 0.999)
	}
	return n + Images(req)
}

// Embeddings counts the input tokens of an embeddings request: each text
// under the model's encoding (times FallbackFactor when it is a proxy), plus
// the length of each token-id array.
func Embeddings(req *job.EmbeddingsRequest) int {
	enc, exact := Encoding(req.Model)
	c := codec(enc)
	n := 0
	for _, t := range req.Texts {
		k, _ := tokensOf(c, t)
		n += k
	}
	if !exact {
		n = int(float64(n)*FallbackFactor + 0.999)
	}
	for _, ids := range req.Tokens {
		n += len(ids)
	}
	return n
}

// Estimate parses a job's request for its endpoint and returns the model it
// names and what a provider charges for it at arrival: for chat, the prompt
// estimate and n x the output limit (defMax when the request names none);
// for embeddings, the input tokens and no output. The estimate names the
// request's shape class (see Class).
func Estimate(endpoint string, body []byte, lim job.Limits, defMax int) (string, job.Estimate, error) {
	if endpoint == job.EndpointEmbeddings {
		req, err := job.ParseEmbeddings(body)
		if err != nil {
			return "", job.Estimate{}, err
		}
		n := Embeddings(req)
		return req.Model, job.Estimate{PromptTokens: n, Class: embeddingsClass(req, n)}, nil
	}
	req, err := job.ParseRequest(body, lim)
	if err != nil {
		return "", job.Estimate{}, err
	}
	n := Prompt(req)
	return req.Model, job.Estimate{PromptTokens: n, MaxTokens: req.ReservedOutput(defMax), Class: chatClass(req, n)}, nil
}

// nativeOnly counts what a Responses job sends a provider serving the
// Responses API itself beyond its chat messages and function tools (the
// body's native member, internal/wire's Native): the input items and
// tools chat has no form for, as their JSON text.
func nativeOnly(c tokenizer.Codec, native json.RawMessage) int {
	if len(native) == 0 {
		return 0
	}
	var in struct {
		Input []json.RawMessage `json:"input"`
		Tools []json.RawMessage `json:"tools"`
	}
	if json.Unmarshal(native, &in) != nil {
		k, _ := c.Count(string(native)) // never less than its text
		return k
	}
	n := 0
	for _, raw := range in.Input {
		switch typeOf(raw) {
		case "", "message", "function_call", "function_call_output":
			continue // in the chat messages
		}
		k, _ := c.Count(string(raw))
		n += k
	}
	for _, raw := range in.Tools {
		if typeOf(raw) != "function" {
			k, _ := c.Count(string(raw))
			n += k
		}
	}
	return n
}

func typeOf(raw json.RawMessage) string {
	var t struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &t)
	return t.Type
}
