package provider

import (
	"context"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Anthropic defaults.
const (
	DefaultAnthropicBaseURL = "https://api.anthropic.com/v1"
	DefaultAnthropicVersion = "2023-06-01"
	// DefaultAnthropicMaxTokens is sent when the chat body names no
	// max_tokens / max_completion_tokens (the Messages API requires one).
	DefaultAnthropicMaxTokens = wire.DefaultAnthropicMaxTokens
)

// AnthropicConfig configures the Anthropic Messages API client.
type AnthropicConfig struct {
	BaseURL string // default DefaultAnthropicBaseURL; the client POSTs to BaseURL+"/messages"
	APIKey  string // sent as x-api-key
	// MaxResponseBytes caps the response body read (0: MaxBodyBytes); a
	// larger answer is a PhaseBody error with ErrBodyTooLarge.
	MaxResponseBytes int
	Version          string // anthropic-version header, default DefaultAnthropicVersion
	// ConnectTimeout and HeaderTimeout: see OpenAIConfig.
	ConnectTimeout, HeaderTimeout time.Duration
	Transport                     http.RoundTripper
}

// Anthropic is a Client that speaks the Messages API while callers keep
// speaking OpenAI chat completions: it converts the request body on the way
// out and the response body on the way back.
type Anthropic struct {
	baseURL, apiKey, version string
	rt                       http.RoundTripper
	maxResp                  int
}

// NewAnthropic returns a client. An invalid BaseURL surfaces as a PhaseBuild
// error from Do.
func NewAnthropic(cfg AnthropicConfig) *Anthropic {
	a := &Anthropic{baseURL: cfg.BaseURL, apiKey: cfg.APIKey, version: cfg.Version, rt: cfg.Transport, maxResp: cfg.MaxResponseBytes}
	if a.baseURL == "" {
		a.baseURL = DefaultAnthropicBaseURL
	}
	if a.version == "" {
		a.version = DefaultAnthropicVersion
	}
	if a.rt == nil {
		a.rt = newTransport(cfg.ConnectTimeout, cfg.HeaderTimeout)
	}
	return a
}

// Do converts c.Body to a Messages API body, POSTs it to {BaseURL}/messages
// and converts the answer back to the OpenAI shape. A body it cannot convert
// is a PhaseBuild error (nothing is sent).
func (a *Anthropic) Do(ctx context.Context, c Call) (*Response, error) {
	ctx = withSendBy(ctx, c)
	if c.Endpoint == job.EndpointEmbeddings {
		return nil, buildErr("the Anthropic API has no embeddings endpoint")
	}
	target, err := endpoint(a.baseURL, "/messages")
	if err != nil {
		return nil, buildErr("%v", err)
	}
	body, err := wire.ChatToAnthropic(c.Body, c.Model)
	if err != nil {
		return nil, buildErr("converting request for the Messages API: %v", err)
	}
	h := baseHeader(c)
	h.Set("X-Api-Key", a.apiKey)
	h.Set("Anthropic-Version", a.version)
	status, hdr, respBody, err := send(ctx, a.rt, target, body, h, a.maxResp)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	r := &Response{Status: status, Header: hdr, Body: respBody, RateLimit: ParseRateLimit(hdr, now)}
	if status >= 200 && status < 300 {
		if conv, u, err := wire.AnthropicToChat(respBody, now); err == nil {
			r.Body, r.Usage = conv, u
		}
	} else if conv, ok := wire.AnthropicErrorToOpenAI(respBody); ok {
		r.Body = conv
	}
	return r, nil
}

// CloseIdleConnections closes kept-alive connections (for shutdown).
func (a *Anthropic) CloseIdleConnections() { closeIdle(a.rt) }
