package config

import (
	"net/url"
	"strings"

	"github.com/sluice-dev/sluice/pkg/clip"
)

// How a provider serves POST /v1/responses (Provider.Responses).
const (
	// ResponsesNative: the provider serves the Responses API itself.
	ResponsesNative = "native"
	// ResponsesChat: the provider is called on Chat Completions, the
	// request and answer translated.
	ResponsesChat = "chat"
)

// NativeResponses reports whether /v1/responses jobs are sent to the
// provider's own Responses API: responses: native, or by default an
// OpenAI-kind provider at api.openai.com. Anthropic providers are always
// called on Messages, Azure ones on chat completions.
func (p *Provider) NativeResponses() bool {
	if p.Kind == "anthropic" || p.Kind == KindAzure {
		return false
	}
	switch p.Responses {
	case ResponsesNative:
		return true
	case ResponsesChat:
		return false
	}
	u, err := url.Parse(p.BaseURL)
	return err == nil && strings.EqualFold(u.Hostname(), "api.openai.com")
}

func checkResponses(p Provider, key string, fail func(key, format string, args ...any)) {
	switch {
	case p.Responses == "" || p.Responses == ResponsesChat:
	case p.Responses == ResponsesNative && p.Kind == "anthropic":
		fail(key+".responses", "must be chat or absent for an anthropic provider (it is called on its Messages API)")
	case p.Responses != ResponsesNative:
		fail(key+".responses", "must be native or chat, got %q", clip.String(p.Responses, shown))
	}
}
