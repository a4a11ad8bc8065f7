package job

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/sluice-dev/sluice/pkg/clip"
)

// Endpoints a job's request may be for (Job.Endpoint).
const (
	EndpointChat       = "chat.completions"
	EndpointEmbeddings = "embeddings"
	// EndpointResponses: the request is a chat-completions body that a
	// Responses API request was translated to (internal/wire). It runs as
	// a chat job; a provider that serves the Responses API natively is
	// called there instead.
	EndpointResponses = "responses"
)

// MaxEmbeddingInputs is how many inputs one embeddings request may carry
// (OpenAI's bound on an array input).
const MaxEmbeddingInputs = 2048

// EmbeddingsRequest is the part of an OpenAI embeddings body Sluice reads.
// The full body is forwarded to the provider untouched.
type EmbeddingsRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format,omitempty"`
	Dimensions     *int            `json:"dimensions,omitempty"`

	// Texts and Tokens are the inputs, as parsed: strings, or arrays of
	// token ids (one request carries one kind).
	Texts  []string `json:"-"`
	Tokens [][]int  `json:"-"`
}

// ParseEmbeddings parses and checks an embeddings body. Input may be a
// string, an array of strings, an array of token ids or an array of such
// arrays, as OpenAI's API allows; an array is one request.
func ParseEmbeddings(body []byte) (*EmbeddingsRequest, error) {
	if err := CheckMembers("request", body, (*EmbeddingsRequest)(nil)); err != nil {
		return nil, err
	}
	var r EmbeddingsRequest
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, DecodeError("request", "embeddings body", err)
	}
	if r.Model == "" {
		return nil, invalid("request.model", "is required")
	}
	in := bytes.TrimSpace(r.Input)
	if len(in) == 0 || string(in) == "null" {
		return nil, invalid("request.input", "is required: a string, an array of strings, or token arrays")
	}
	var one string
	var many []string
	var ids []int
	var idss [][]int
	switch {
	case json.Unmarshal(in, &one) == nil:
		r.Texts = []string{one}
	case json.Unmarshal(in, &many) == nil:
		r.Texts = many
	case json.Unmarshal(in, &ids) == nil:
		r.Tokens = [][]int{ids}
	case json.Unmarshal(in, &idss) == nil:
		r.Tokens = idss
	default:
		return nil, invalid("request.input", "must be a string, an array of strings, an array of token ids or an array of token arrays")
	}
	n := len(r.Texts) + len(r.Tokens)
	if n == 0 {
		return nil, invalid("request.input", "must hold at least one input")
	}
	if n > MaxEmbeddingInputs {
		return nil, invalid("request.input", "holds %d inputs; at most %d", n, MaxEmbeddingInputs)
	}
	for i, t := range r.Texts {
		if t == "" {
			return nil, invalid(fmt.Sprintf("request.input[%d]", i), "must not be empty")
		}
	}
	for i, t := range r.Tokens {
		if len(t) == 0 {
			return nil, invalid(fmt.Sprintf("request.input[%d]", i), "must not be empty")
		}
	}
	switch r.EncodingFormat {
	case "", "float", "base64":
	default:
		return nil, invalid("request.encoding_format", "must be float or base64, got %q", clip.String(r.EncodingFormat, 64))
	}
	if r.Dimensions != nil && *r.Dimensions <= 0 {
		return nil, invalid("request.dimensions", "must be positive, got %d", *r.Dimensions)
	}
	return &r, nil
}

// Inputs is how many inputs the request carries.
func (r *EmbeddingsRequest) Inputs() int { return len(r.Texts) + len(r.Tokens) }
