package provider

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
)

// DefaultAzureAPIVersion is the api-version an Azure provider sends when
// its configuration names none: the generally available data-plane
// version that serves chat completions and embeddings.
const DefaultAzureAPIVersion = "2024-10-21"

// AzureConfig configures an Azure OpenAI resource.
type AzureConfig struct {
	// BaseURL is the resource's endpoint (https://NAME.openai.azure.com):
	// calls go to {BaseURL}/openai/deployments/{deployment}/chat/completions
	// (or /embeddings) ?api-version=APIVersion.
	BaseURL    string
	APIKey     string // sent as the api-key header; omitted when empty
	APIVersion string // "": DefaultAzureAPIVersion
	// MaxResponseBytes, ConnectTimeout, HeaderTimeout and Transport are
	// OpenAIConfig's.
	MaxResponseBytes int
	ConnectTimeout   time.Duration
	HeaderTimeout    time.Duration
	Transport        http.RoundTripper
}

// Azure is a Client for Azure OpenAI deployments. The deployment is the
// call's Model (the model's upstream name when it has one); the body is
// the OpenAI one, which Azure takes as it is.
type Azure struct {
	baseURL, apiKey, version string
	rt                       http.RoundTripper
	maxResp                  int
}

// NewAzure returns a client. An invalid BaseURL surfaces as a PhaseBuild
// error from Do.
func NewAzure(cfg AzureConfig) *Azure {
	rt := cfg.Transport
	if rt == nil {
		rt = newTransport(cfg.ConnectTimeout, cfg.HeaderTimeout)
	}
	v := cfg.APIVersion
	if v == "" {
		v = DefaultAzureAPIVersion
	}
	return &Azure{baseURL: cfg.BaseURL, apiKey: cfg.APIKey, version: v, rt: rt, maxResp: cfg.MaxResponseBytes}
}

// target is the URL of c's deployment and endpoint.
func (a *Azure) target(c Call) (string, error) {
	deployment := c.Model
	if deployment == "" {
		var b struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(c.Body, &b)
		deployment = b.Model
	}
	if deployment == "" {
		return "", buildErr("no deployment: the call names no model")
	}
	path := "/chat/completions"
	if c.Endpoint == job.EndpointEmbeddings {
		path = "/embeddings"
	}
	base, err := endpoint(a.baseURL, "/openai/deployments/"+url.PathEscape(deployment)+path)
	if err != nil {
		return "", buildErr("%v", err)
	}
	return base + "?api-version=" + url.QueryEscape(a.version), nil
}

func (a *Azure) header(c Call) http.Header {
	h := baseHeader(c)
	if a.apiKey != "" {
		h.Set("Api-Key", a.apiKey)
	}
	return h
}

// Do POSTs c to its deployment's chat completions (or embeddings).
func (a *Azure) Do(ctx context.Context, c Call) (*Response, error) {
	ctx = withSendBy(ctx, c)
	target, err := a.target(c)
	if err != nil {
		return nil, err
	}
	body, err := forChat(c)
	if err != nil {
		return nil, err
	}
	status, hdr, resp, err := send(ctx, a.rt, target, body, a.header(c), a.maxResp)
	if err != nil {
		return nil, err
	}
	hdr = azureHeader(hdr)
	r := &Response{Status: status, Header: hdr, Body: resp, RateLimit: ParseRateLimit(hdr, time.Now())}
	if status >= 200 && status < 300 {
		r.Usage, r.Answer = ParseAnswer(resp)
	}
	return r, nil
}

// Stream POSTs c (which asks for stream: true) and reads OpenAI's chunks,
// which Azure sends.
func (a *Azure) Stream(ctx context.Context, c Call) (*Response, *Stream, error) {
	ctx = withSendBy(ctx, c)
	target, err := a.target(c)
	if err != nil {
		return nil, nil, err
	}
	body, err := forChat(c)
	if err != nil {
		return nil, nil, err
	}
	r, st, err := openStream(ctx, a.rt, target, body, a.header(c), a.maxResp, openAIEvent, func(b []byte) [][]byte { return raw(job.CompletionChunks(b, true)) })
	if r != nil {
		r.Header = azureHeader(r.Header)
		r.RateLimit = ParseRateLimit(r.Header, time.Now())
	}
	return r, st, err
}

// CloseIdleConnections closes kept-alive connections (for shutdown).
func (a *Azure) CloseIdleConnections() { closeIdle(a.rt) }

// azureHeader is h as the rest of Sluice may read it. Azure evaluates a
// deployment's limits over 1- or 10-second windows, and the
// x-ratelimit-limit-* it sometimes sends state such a window (a 120-RPM
// deployment: limit-requests 20), as do the remaining counts beside them:
// read as per-minute figures they would teach a limit six times too low
// and charge the shared window for calls never made. Those headers are
// dropped; x-ratelimit-remaining-* sent alone (the deployment's minute),
// retry-after(-ms) and x-ratelimit-reset-* stay.
func azureHeader(h http.Header) http.Header {
	if h.Get("X-Ratelimit-Limit-Requests") == "" && h.Get("X-Ratelimit-Limit-Tokens") == "" {
		return h
	}
	h = h.Clone()
	for _, n := range []string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Remaining-Tokens"} {
		h.Del(n)
	}
	return h
}
