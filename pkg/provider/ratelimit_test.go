package provider_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/provider"
)

// TestClassifyRateLimit places 429s as each provider sends them.
func TestClassifyRateLimit(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	openaiBody := func(typ, msg string) []byte {
		return []byte(`{"error":{"message":"` + msg + `","type":"` + typ + `","param":null,"code":"rate_limit_exceeded"}}`)
	}
	cost := provider.Cost{Requests: 1, Tokens: 5000}
	for _, tc := range []struct {
		name    string
		status  int
		h       http.Header
		body    []byte
		kind    provider.RateLimitKind
		dim     string
		statedR int
		statedT int
	}{
		{"OpenAI per-second quantum: the minute still has room", 429,
			hdr("x-ratelimit-limit-requests", "150", "x-ratelimit-remaining-requests", "97", "x-ratelimit-limit-tokens", "150000", "x-ratelimit-remaining-tokens", "91000",
				"x-ratelimit-reset-requests", "21s", "x-ratelimit-reset-tokens", "23.6s", "retry-after-ms", "340", "retry-after", "1"),
			openaiBody("requests", "Rate limit reached for gpt-4o-mini in organization org-x on requests per min (RPM): Limit 150, Used 53, Requested 1."),
			provider.LimitBurst, "requests", 150, 150000},
		{"OpenAI tokens per minute spent", 429,
			hdr("x-ratelimit-limit-tokens", "150000", "x-ratelimit-remaining-tokens", "1200", "x-ratelimit-limit-requests", "500", "x-ratelimit-remaining-requests", "480", "retry-after", "20"),
			openaiBody("tokens", "Rate limit reached for gpt-4o-mini in organization org-x on tokens per min (TPM): Limit 150000, Used 148800, Requested 5000."),
			provider.LimitMinute, "tokens", 500, 150000},
		{"OpenAI requests per minute, message only, no headers", 429, hdr("retry-after", "7"),
			openaiBody("requests", "Rate limit reached for gpt-4o-mini in organization org-x on requests per min (RPM): Limit 3, Used 3, Requested 1."),
			provider.LimitMinute, "requests", 3, -1},
		{"Anthropic tokens spent (RFC 3339 reset)", 429,
			hdr("anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "42", "anthropic-ratelimit-tokens-limit", "40000",
				"anthropic-ratelimit-tokens-remaining", "0", "anthropic-ratelimit-tokens-reset", "2026-11-30T12:00:30Z", "retry-after", "30"),
			[]byte(`{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed your organization's rate limit of 40,000 input tokens per minute."}}`),
			provider.LimitMinute, "tokens", 50, 40000},
		{"Anthropic output tokens spent", 429,
			hdr("anthropic-ratelimit-output-tokens-remaining", "0", "anthropic-ratelimit-requests-remaining", "10", "retry-after", "12"),
			[]byte(`{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your rate limit."}}`),
			provider.LimitMinute, "tokens", -1, -1},
		{"Anthropic acceleration", 429, hdr("retry-after", "5", "anthropic-ratelimit-requests-remaining", "40"),
			[]byte(`{"type":"error","error":{"type":"rate_limit_error","message":"Your usage is increasing too quickly: acceleration limit reached. Please ramp up gradually."}}`),
			provider.LimitAcceleration, "", -1, -1},
		{"Azure remaining-only, room left (a 1- or 10-s window)", 429,
			hdr("x-ratelimit-remaining-requests", "45", "x-ratelimit-remaining-tokens", "60000", "retry-after-ms", "800", "retry-after", "1"),
			[]byte(`{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded call rate limit of your current OpenAI S0 pricing tier. Please retry after 1 second."}}`),
			provider.LimitBurst, "", -1, -1},
		{"Azure remaining-only, no room", 429,
			hdr("x-ratelimit-remaining-requests", "0", "x-ratelimit-remaining-tokens", "60000", "retry-after-ms", "12000", "retry-after", "12"),
			[]byte(`{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 12 seconds."}}`),
			provider.LimitMinute, "requests", -1, -1},
		{"Gemini per-day quota", 429, hdr(),
			[]byte(`{"error":{"code":429,"message":"Quota exceeded for quota metric 'Generate Content API requests per day' and limit 'GenerateContent request limit per day' of service.","status":"RESOURCE_EXHAUSTED"}}`),
			provider.LimitQuota, "requests", -1, -1},
		{"Gemini per-minute with a wait in the message", 429, hdr(),
			[]byte(`{"error":{"code":429,"message":"You exceeded your current quota for requests per minute. Please retry in 46s.","status":"RESOURCE_EXHAUSTED"}}`),
			provider.LimitMinute, "requests", -1, -1},
		{"OpenAI insufficient_quota", 429, hdr(),
			[]byte(`{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`),
			provider.LimitQuota, "", -1, -1},
		{"too many concurrent requests", 429, hdr("retry-after", "1"),
			[]byte(`{"error":{"message":"Too many concurrent requests for this model.","type":"requests","code":"rate_limit_exceeded"}}`),
			provider.LimitConcurrency, "requests", -1, -1},
		{"hidden provider, short wait", 429, hdr("retry-after", "1"),
			openaiBody("requests", "Rate limit reached. Please try again later."), provider.LimitBurst, "requests", -1, -1},
		{"hidden provider, long wait", 429, hdr("retry-after", "20"),
			openaiBody("tokens", "Rate limit reached. Please try again later."), provider.LimitUnknown, "tokens", -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := provider.Classify(&provider.Response{Status: tc.status, Header: tc.h, Body: tc.body}, nil, now)
			got := provider.ClassifyRateLimit(o, tc.h, cost, now)
			if tc.name == "Gemini per-minute with a wait in the message" && got.RetryAfter != 46*time.Second {
				t.Errorf("retry after %v, want the 46 s the message names", got.RetryAfter)
			}
			if got.Kind != tc.kind || got.Dimension != tc.dim || got.StatedLimitRequests != tc.statedR || got.StatedLimitTokens != tc.statedT {
				t.Errorf("got kind %q dim %q stated %d/%d; want %q %q %d/%d (outcome %+v)", got.Kind, got.Dimension,
					got.StatedLimitRequests, got.StatedLimitTokens, tc.kind, tc.dim, tc.statedR, tc.statedT, o)
			}
		})
	}
}

// FuzzClassifyRateLimit: any headers and body give one of the kinds, and
// no panic.
func FuzzClassifyRateLimit(f *testing.F) {
	f.Add("97", "0", "1", `{"error":{"message":"on tokens per min (TPM): Limit 150000, Used 1","type":"tokens"}}`)
	f.Add("", "", "2026-11-30T12:00:30Z", `{"type":"error","error":{"type":"rate_limit_error","message":"acceleration"}}`)
	f.Add("-1", "1e99", "NaN", `not json`)
	f.Fuzz(func(t *testing.T, remR, remT, retry, body string) {
		h := http.Header{}
		h.Set("x-ratelimit-remaining-requests", remR)
		h.Set("x-ratelimit-remaining-tokens", remT)
		h.Set("retry-after", retry)
		h.Set("anthropic-ratelimit-tokens-reset", retry)
		now := time.Unix(1_750_000_000, 0)
		o := provider.Classify(&provider.Response{Status: 429, Header: h, Body: []byte(body)}, nil, now)
		got := provider.ClassifyRateLimit(o, h, provider.Cost{Requests: 1, Tokens: 100}, now)
		switch got.Kind {
		case provider.LimitBurst, provider.LimitMinute, provider.LimitConcurrency, provider.LimitAcceleration, provider.LimitQuota, provider.LimitUnknown:
		default:
			t.Fatalf("kind %q", got.Kind)
		}
		if got.RetryAfter < 0 {
			t.Fatalf("negative retry-after %v", got.RetryAfter)
		}
	})
}
