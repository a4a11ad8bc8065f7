package provider

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// rlNow is the clock of the rate-limit tests; Anthropic resets are RFC 3339
// times after it.
var rlNow = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// hdr builds a header the way net/http receives it: names canonicalised,
// so they can be written as the providers send them (lower case).
func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// geminiErr builds a Gemini (generativelanguage.googleapis.com) error body;
// details is the raw JSON of the details array, "" for none.
func geminiErr(msg, details string) string {
	d := ""
	if details != "" {
		d = `,"details":` + details
	}
	return `{"error":{"code":429,"message":` + jsonString(msg) + `,"status":"RESOURCE_EXHAUSTED"` + d + `}}`
}

func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// azureErr builds an Azure OpenAI error body (code "429", no type).
func azureErr(msg string) string {
	return `{"error":{"code":"429","message":` + jsonString(msg) + `}}`
}

const (
	geminiQuotaMsg = "You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits. To monitor your current usage, head to: https://ai.dev/usage?tab=rate-limit. \n* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 10, model: gemini-2.5-flash\nPlease retry in 46.114142718s."
	geminiHelp     = `{"@type":"type.googleapis.com/google.rpc.Help","links":[{"description":"Learn more about Gemini API quotas","url":"https://ai.google.dev/gemini-api/docs/rate-limits"}]}`
	azureTokenMsg  = "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-02-01 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 6 seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."
)

// azureHdr is what Azure OpenAI sends with a 429: remaining counts only,
// retry-after(-ms), and its own request ids.
func azureHdr(remainingRequests, remainingTokens string, extra ...string) http.Header {
	h := hdr("apim-request-id", "bb943c68-99ed-46ab-bda9-a5efbdf5897a", "x-ms-region", "North Central US",
		"x-ratelimit-remaining-requests", remainingRequests, "x-ratelimit-remaining-tokens", remainingTokens,
		"retry-after-ms", "6000", "retry-after", "6", "x-ms-client-request-id", "bb943c68-99ed-46ab-bda9-a5efbdf5897a")
	for i := 0; i+1 < len(extra); i += 2 {
		h.Set(extra[i], extra[i+1])
	}
	return h
}

// anthropicHdr is what the Messages API sends with a 429.
func anthropicHdr(kv ...string) http.Header {
	reset := rlNow.Add(40 * time.Second).Format(time.RFC3339)
	h := hdr(
		"anthropic-ratelimit-requests-limit", "1000", "anthropic-ratelimit-requests-remaining", "998", "anthropic-ratelimit-requests-reset", reset,
		"anthropic-ratelimit-input-tokens-limit", "50000", "anthropic-ratelimit-input-tokens-remaining", "40000", "anthropic-ratelimit-input-tokens-reset", reset,
		"anthropic-ratelimit-output-tokens-limit", "10000", "anthropic-ratelimit-output-tokens-remaining", "9000", "anthropic-ratelimit-output-tokens-reset", reset,
		"anthropic-ratelimit-tokens-limit", "60000", "anthropic-ratelimit-tokens-remaining", "49000", "anthropic-ratelimit-tokens-reset", reset,
		"retry-after", "7", "request-id", "req_011CSHoEeqs5C35K2UUqR7Fy")
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// openAIHdr is what api.openai.com sends with a 429.
func openAIHdr(kv ...string) http.Header {
	h := hdr("x-ratelimit-limit-requests", "500", "x-ratelimit-limit-tokens", "30000",
		"x-ratelimit-remaining-requests", "499", "x-ratelimit-remaining-tokens", "12000",
		"x-ratelimit-reset-requests", "120ms", "x-ratelimit-reset-tokens", "36s",
		"retry-after-ms", "174", "retry-after", "1", "x-request-id", "req_abc")
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

type rlCase struct {
	name   string
	status int // 0 means 429
	body   string
	header http.Header
	cost   Cost

	kind       RateLimitKind
	dim        string
	limitReq   int // StatedLimitRequests
	limitTok   int // StatedLimitTokens
	retryAfter time.Duration
	checkRetry bool
}

var rlCases = []rlCase{
	// OpenAI: the headers describe the minute bucket; a 429 while they show
	// room is the per-second quantum.
	{name: "openai burst, minute has room", body: oaiErr("tokens", "rate_limit_exceeded", "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 17000, Requested 2000. Please try again in 174ms. Visit https://platform.openai.com/account/rate-limits to learn more."),
		header: openAIHdr(), cost: Cost{1, 2000, 0}, kind: LimitBurst, dim: "tokens", limitReq: 500, limitTok: 30000, retryAfter: 174 * time.Millisecond, checkRetry: true},
	{name: "openai minute spent on tokens", body: oaiErr("tokens", "rate_limit_exceeded", "Rate limit reached for gpt-4.1 in organization org-x on tokens per min (TPM): Limit 30000, Used 18928, Requested 11159. Please try again in 174ms. Visit https://platform.openai.com/account/rate-limits to learn more."),
		header: openAIHdr("x-ratelimit-remaining-tokens", "11072"), cost: Cost{1, 11159, 0}, kind: LimitMinute, dim: "tokens", limitReq: 500, limitTok: 30000},
	{name: "openai requests minute, message only", body: oaiErr("requests", "rate_limit_exceeded", "Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s. Visit https://platform.openai.com/account/rate-limits to learn more."),
		cost: Cost{1, 500, 0}, kind: LimitMinute, dim: "requests", limitReq: 3, limitTok: -1, retryAfter: 20 * time.Second, checkRetry: true},
	{name: "openai tokens, message only, room left", body: oaiErr("tokens", "rate_limit_exceeded", "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 150000, Used 12000, Requested 5000. Please try again in 6ms."),
		cost: Cost{1, 5000, 0}, kind: LimitBurst, dim: "tokens", limitReq: -1, limitTok: 150000},
	{name: "openai tokens, message only, spent", body: oaiErr("tokens", "rate_limit_exceeded", "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 150000, Used 149000, Requested 5000. Please try again in 2s."),
		cost: Cost{1, 5000, 0}, kind: LimitMinute, dim: "tokens", limitReq: -1, limitTok: 150000, retryAfter: 2 * time.Second, checkRetry: true},
	{name: "openai request larger than the minute", body: oaiErr("tokens", "rate_limit_exceeded", "Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 30601. The input or output tokens must be reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more."),
		cost: Cost{1, 30601, 0}, kind: LimitMinute, dim: "tokens", limitReq: -1, limitTok: 30000},
	{name: "openai legacy per-min message", body: oaiErr("requests", "rate_limit_exceeded", "Rate limit reached for default-gpt-3.5-turbo in organization org-x on requests per min. Limit: 3 / min. Please try again in 20s. Contact us through our help center at help.openai.com if you continue to have issues."),
		kind: LimitMinute, dim: "requests", limitReq: 3, limitTok: -1},
	{name: "openai requests per day", body: oaiErr("requests", "rate_limit_exceeded", "Rate limit reached for gpt-4 in organization org-x on requests per day (RPD): Limit 200, Used 200, Requested 1. Please try again in 7m12s. Visit https://platform.openai.com/account/rate-limits to learn more."),
		kind: LimitQuota, dim: "requests", limitReq: -1, limitTok: -1, retryAfter: 7*time.Minute + 12*time.Second, checkRetry: true},
	{name: "openai limit 0", body: oaiErr("tokens", "rate_limit_exceeded", "Rate limit reached for o1 in organization org-x on tokens per min (TPM): Limit 0, Used 0, Requested 120."),
		kind: LimitQuota, dim: "tokens", limitReq: -1, limitTok: 0},
	{name: "openai insufficient_quota", body: oaiErr("insufficient_quota", "insufficient_quota", "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."),
		header: hdr("x-request-id", "req_1"), kind: LimitQuota, limitReq: -1, limitTok: -1},

	// Anthropic: token buckets, RFC 3339 resets.
	{name: "anthropic input tokens spent", body: antErr("rate_limit_error", "This request would exceed the rate limit for your organization (a5ee820e) of 50,000 input tokens per minute. For details, refer to: https://docs.anthropic.com/en/api/rate-limits. You can see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try again later."),
		header: anthropicHdr("anthropic-ratelimit-input-tokens-remaining", "0", "anthropic-ratelimit-tokens-remaining", "0"), cost: Cost{1, 4096, 0},
		kind: LimitMinute, dim: "tokens", limitReq: 1000, limitTok: 50000, retryAfter: 7 * time.Second, checkRetry: true},
	{name: "anthropic output tokens spent", body: antErr("rate_limit_error", "This request would exceed the rate limit for your organization (a5ee820e) of 8,000 output tokens per minute."),
		header: anthropicHdr("anthropic-ratelimit-output-tokens-remaining", "0"), cost: Cost{1, 2000, 0}, kind: LimitMinute, dim: "output_tokens", limitReq: 1000, limitTok: 50000},
	{name: "anthropic requests spent", body: antErr("rate_limit_error", "Number of requests has exceeded your rate limit."),
		header: anthropicHdr("anthropic-ratelimit-requests-remaining", "0"), cost: Cost{1, 100, 0}, kind: LimitMinute, dim: "requests", limitReq: 1000, limitTok: 50000},
	{name: "anthropic bucket has room", body: antErr("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit (https://docs.anthropic.com/en/api/rate-limits); see the response headers for current usage."),
		header: anthropicHdr(), cost: Cost{1, 3000, 0}, kind: LimitBurst, dim: "tokens", limitReq: 1000, limitTok: 50000},
	// Anthropic documents acceleration limits but not their wording; this
	// message is illustrative, matched on "acceleration".
	{name: "anthropic acceleration", body: antErr("rate_limit_error", "Your organization's usage increased too quickly: this request was rejected by an acceleration limit. Please ramp up your usage gradually."),
		header: anthropicHdr(), cost: Cost{1, 3000, 0}, kind: LimitAcceleration, limitReq: 1000, limitTok: 50000},
	{name: "anthropic concurrent connections", body: antErr("rate_limit_error", "Number of concurrent connections has exceeded your rate limit. Please try again later or contact sales at https://www.anthropic.com/contact-sales to discuss your options for a rate limit increase."),
		header: anthropicHdr(), cost: Cost{1, 300, 0}, kind: LimitConcurrency, limitReq: 1000, limitTok: 50000},
	{name: "anthropic message only", body: antErr("rate_limit_error", "This request would exceed the rate limit for your organization (a5ee820e) of 50,000 input tokens per minute."),
		kind: LimitMinute, dim: "tokens", limitReq: -1, limitTok: 50000},

	// Azure OpenAI: remaining counts only; RPM is enforced over 1-10 s.
	{name: "azure room left", body: azureErr(azureTokenMsg), header: azureHdr("79", "61353"), cost: Cost{1, 2000, 0},
		kind: LimitBurst, dim: "tokens", limitReq: -1, limitTok: -1, retryAfter: 6 * time.Second, checkRetry: true},
	{name: "azure tokens spent", body: azureErr(azureTokenMsg), header: azureHdr("45", "0"), cost: Cost{1, 2000, 0},
		kind: LimitMinute, dim: "tokens", limitReq: -1, limitTok: -1},
	{name: "azure tokens below cost", body: azureErr(azureTokenMsg), header: azureHdr("45", "1500"), cost: Cost{1, 2000, 0},
		kind: LimitMinute, dim: "tokens", limitReq: -1, limitTok: -1},
	{name: "azure call rate, 10 s window limit header not per minute", body: azureErr("Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-02-01 have exceeded call rate limit of your current OpenAI S0 pricing tier. Please retry after 1 second."),
		header: azureHdr("45", "80000", "x-ratelimit-limit-requests", "20", "retry-after-ms", "900", "retry-after", "1"), cost: Cost{1, 2000, 0},
		kind: LimitBurst, dim: "requests", limitReq: -1, limitTok: -1, retryAfter: 900 * time.Millisecond, checkRetry: true},
	{name: "azure reset-tokens instead of retry-after", body: azureErr("Your requests to gpt-4.1-nano for gpt-4.1-nano in Sweden Central have exceeded the token rate limit for your current AIServices S0 pricing tier."),
		header: hdr("apim-request-id", "x", "x-rate-limit-reset-tokens", "55", "policy-id", "DeploymentRatelimit-Token", "x-ms-region", "West US"),
		kind:   LimitUnknown, dim: "tokens", limitReq: -1, limitTok: -1, retryAfter: 55 * time.Second, checkRetry: true},
	{name: "azure daily quota (86400 s)", body: azureErr("Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-08-01-preview have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 86400 seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."),
		header: hdr("apim-request-id", "x", "retry-after", "86400"), kind: LimitQuota, dim: "tokens", limitReq: -1, limitTok: -1, retryAfter: 24 * time.Hour, checkRetry: true},

	// Gemini: no headers; the body names the quota and the wait.
	{name: "gemini per-day quota", body: geminiErr(strings.Replace(geminiQuotaMsg, "46.114142718s", "8h2m3s", 1),
		`[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.5-flash"},"quotaValue":"250"}]},`+geminiHelp+`,{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"28923s"}]`),
		kind: LimitQuota, dim: "requests", limitReq: -1, limitTok: -1, retryAfter: 28923 * time.Second, checkRetry: true},
	{name: "gemini per-day listed with per-minute, short delay", body: geminiErr(geminiQuotaMsg,
		`[`+geminiHelp+`,{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"},{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"47s"}]`),
		kind: LimitQuota, dim: "requests", limitReq: -1, limitTok: -1, retryAfter: 47 * time.Second, checkRetry: true},
	{name: "gemini per-minute, retry in 46s", body: geminiErr(geminiQuotaMsg,
		`[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_input_token_count","quotaId":"GenerateContentInputTokensPerModelPerMinute-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.5-flash"},"quotaValue":"250000"}]},`+geminiHelp+`,{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"46s"}]`),
		kind: LimitMinute, dim: "tokens", limitReq: -1, limitTok: -1, retryAfter: 46 * time.Second, checkRetry: true},
	{name: "gemini per-minute, message only", body: geminiErr(geminiQuotaMsg, ""),
		kind: LimitMinute, dim: "requests", limitReq: -1, limitTok: -1, retryAfter: 46114142718, checkRetry: true},
	{name: "gemini long message, wait past truncation", body: geminiErr(strings.Replace(geminiQuotaMsg, "\nPlease", strings.Repeat("\n* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 10, model: gemini-2.5-flash", 4)+"\nPlease", 1), ""),
		kind: LimitMinute, dim: "requests", limitReq: -1, limitTok: -1, retryAfter: 46114142718, checkRetry: true},
	{name: "gemini model not on free tier (limit: 0)", body: geminiErr("You exceeded your current quota, please check your plan and billing details.\n* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 0, model: gemini-3.1-pro\nPlease retry in 5.237548564s.", ""),
		kind: LimitQuota, dim: "requests", limitReq: -1, limitTok: -1},
	{name: "gemini legacy per-minute ErrorInfo", body: `{"error":{"code":429,"message":"Quota exceeded for quota metric 'Generate Content API requests per minute' and limit 'GenerateContent request limit per minute for a region' of service 'generativelanguage.googleapis.com' for consumer 'project_number:1'.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"RATE_LIMIT_EXCEEDED","domain":"googleapis.com","metadata":{"quota_metric":"generativelanguage.googleapis.com/generate_content_requests","quota_limit":"GenerateContentRequestsPerMinutePerProjectPerRegion","quota_limit_value":"0"}}]}}`,
		kind: LimitMinute, dim: "requests", limitReq: -1, limitTok: -1},
	{name: "gemini per-day ErrorInfo", body: `{"error":{"code":429,"message":"Quota exceeded for quota metric 'Gemini 2.5 Pro Requests' and limit 'Gemini 2.5 Pro Requests per day per user per tier' of service 'cloudcode-pa.googleapis.com'.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"RATE_LIMIT_EXCEEDED","domain":"googleapis.com","metadata":{"quota_metric":"cloudcode-pa.googleapis.com/gemini_2_5_pro_requests","quota_limit":"Gemini25ProRequestsPerDay"}}]}}`,
		kind: LimitQuota, dim: "requests", limitReq: -1, limitTok: -1},
	{name: "gemini openai-compat generic", body: `[{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}]`,
		kind: LimitUnknown, limitReq: -1, limitTok: -1},
	{name: "vertex shared pool", body: `[{"error":{"code":429,"message":"Resource exhausted. Please try again later. Please refer to https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more details.","status":"RESOURCE_EXHAUSTED"}}]`,
		kind: LimitUnknown, limitReq: -1, limitTok: -1},

	// Money and spend, whatever the status.
	{name: "anthropic billing_error", status: 402, body: antErr("billing_error", "billing issue"), kind: LimitQuota, limitReq: -1, limitTok: -1},
	{name: "spend limit message", body: `{"error":{"message":"Claude Code workspace spend limit reached"}}`, header: hdr("retry-after", "30"), kind: LimitQuota, limitReq: -1, limitTok: -1},

	// Concurrency from other servers.
	{name: "too many concurrent requests", body: `{"error":{"message":"Too many concurrent requests. Limit: 1 concurrent requests","type":"rate_limit_error"}}`,
		header: hdr("retry-after", "1"), kind: LimitConcurrency, limitReq: -1, limitTok: -1},
	{name: "concurrent requests for model", body: `{"error":"Too many concurrent requests for this model"}`, kind: LimitConcurrency, limitReq: -1, limitTok: -1},

	// Hidden providers: a bare 429.
	{name: "generic 429, retry-after 1", body: `{"message":"Too Many Requests"}`, header: hdr("retry-after", "1"),
		kind: LimitBurst, limitReq: -1, limitTok: -1, retryAfter: time.Second, checkRetry: true},
	{name: "generic 429, retry-after 20", body: `{"message":"Too Many Requests"}`, header: hdr("retry-after", "20"),
		kind: LimitUnknown, limitReq: -1, limitTok: -1, retryAfter: 20 * time.Second, checkRetry: true},
	{name: "generic 429, nothing", kind: LimitUnknown, limitReq: -1, limitTok: -1},
	{name: "generic 429, retry-after 2 hours", body: `rate limited`, header: hdr("retry-after", "7200"), kind: LimitQuota, limitReq: -1, limitTok: -1},
	{name: "generic 429, remaining headers only", body: `{"message":"slow down"}`, header: hdr("x-ratelimit-remaining-requests", "0"), kind: LimitMinute, dim: "requests", limitReq: -1, limitTok: -1},
}

func TestClassifyRateLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range rlCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			status := tc.status
			if status == 0 {
				status = http.StatusTooManyRequests
			}
			h := tc.header
			if h == nil {
				h = http.Header{}
			}
			o := Classify(&Response{Status: status, Header: h, Body: []byte(tc.body)}, nil, rlNow)
			got := ClassifyRateLimit(o, h, tc.cost, rlNow)
			if got.Kind != tc.kind || got.Dimension != tc.dim || got.StatedLimitRequests != tc.limitReq || got.StatedLimitTokens != tc.limitTok {
				t.Errorf("got kind=%s dim=%q limits=%d/%d, want %s %q %d/%d\noutcome %+v\ninfo %+v",
					got.Kind, got.Dimension, got.StatedLimitRequests, got.StatedLimitTokens, tc.kind, tc.dim, tc.limitReq, tc.limitTok, o, got)
			}
			if tc.checkRetry && got.RetryAfter != tc.retryAfter {
				t.Errorf("retry after = %v, want %v", got.RetryAfter, tc.retryAfter)
			}
			if got.RateLimit != ParseRateLimit(h, rlNow) {
				t.Errorf("RateLimit = %+v, want ParseRateLimit's", got.RateLimit)
			}
		})
	}
}

func TestClassifyRateLimitAnthropicReset(t *testing.T) {
	t.Parallel()
	h := anthropicHdr("anthropic-ratelimit-input-tokens-remaining", "0", "anthropic-ratelimit-tokens-remaining", "0")
	o := Classify(&Response{Status: 429, Header: h, Body: []byte(antErr("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"))}, nil, rlNow)
	got := ClassifyRateLimit(o, h, Cost{1, 1000, 0}, rlNow)
	if got.RateLimit.ResetTokens != 40*time.Second || got.RateLimit.RemainingTokens != 0 || got.RateLimit.LimitTokens != 50000 {
		t.Errorf("rate limit %+v", got.RateLimit)
	}
}

// A hand-built Outcome (no Classify) is classified by code, and a zero cost
// counts as one request / one token.
func TestClassifyRateLimitHandBuilt(t *testing.T) {
	t.Parallel()
	if got := ClassifyRateLimit(Outcome{Code: "insufficient_quota"}, nil, Cost{}, rlNow); got.Kind != LimitQuota {
		t.Errorf("insufficient_quota code: %+v", got)
	}
	if got := ClassifyRateLimit(Outcome{Code: "billing_error"}, nil, Cost{}, rlNow); got.Kind != LimitQuota {
		t.Errorf("billing_error type: %+v", got)
	}
	h := hdr("x-ratelimit-remaining-tokens", "1", "x-ratelimit-remaining-requests", "1")
	if got := ClassifyRateLimit(Outcome{HTTPStatus: 429, Class: Retry}, h, Cost{}, rlNow); got.Kind != LimitBurst {
		t.Errorf("one left of each, zero cost: %+v", got)
	}
	h.Set("x-ratelimit-remaining-tokens", "0")
	if got := ClassifyRateLimit(Outcome{HTTPStatus: 429, Class: Retry}, h, Cost{}, rlNow); got.Kind != LimitMinute || got.Dimension != "tokens" {
		t.Errorf("tokens at 0: %+v", got)
	}
	if got := ClassifyRateLimit(Outcome{}, nil, Cost{}, rlNow); got.Kind != LimitUnknown || got.StatedLimitRequests != -1 || got.StatedLimitTokens != -1 {
		t.Errorf("zero outcome: %+v", got)
	}
}

func TestMessageWait(t *testing.T) {
	t.Parallel()
	for msg, want := range map[string]time.Duration{
		"Please try again in 174ms.":                    174 * time.Millisecond,
		"Please try again in 7m12s. Visit":              7*time.Minute + 12*time.Second,
		"Please retry in 46.114142718s.":                46114142718,
		"Please retry after 6 seconds. Please go here:": 6 * time.Second,
		"Please retry after 1 second.":                  time.Second,
		"try again in 2 minutes":                        2 * time.Minute,
		"Please retry after 86400 seconds.":             24 * time.Hour,
		"retry after 99999999 hours":                    maxHint,
		"Please try again later.":                       0,
		"retry in -5s":                                  0,
		"":                                              0,
	} {
		if got := messageWait(msg); got != want {
			t.Errorf("messageWait(%q) = %v, want %v", msg, got, want)
		}
	}
}

func TestGoogleDetails(t *testing.T) {
	t.Parallel()
	body := geminiErr("x", `[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"A-PerDay"},{"quotaId":"A-PerDay"},{"quotaId":7},"junk",{"quotaId":"B,C"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"-3s"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"2.5s"},3,null]`)
	o := Classify(&Response{Status: 429, Body: []byte(body)}, nil, rlNow)
	// The violations array holds a non-object, so that whole detail is
	// skipped; RetryInfo still reads.
	if o.Quota != "" || o.RetryDelay != 2500*time.Millisecond {
		t.Errorf("quota %q delay %v", o.Quota, o.RetryDelay)
	}
	body = geminiErr("x", `[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"A-PerDay"},{"quotaId":"A-PerDay"},{"quotaId":"B,C"},{"quotaId":"D-PerMinute"}]}]`)
	o = Classify(&Response{Status: 429, Body: []byte(body)}, nil, rlNow)
	if o.Quota != "A-PerDay,D-PerMinute" {
		t.Errorf("quota %q", o.Quota)
	}
	if o.RetryDelay != 0 {
		t.Errorf("delay %v", o.RetryDelay)
	}
}

func FuzzClassifyRateLimit(f *testing.F) {
	for _, tc := range rlCases {
		h := tc.header
		if h == nil {
			h = http.Header{}
		}
		f.Add([]byte(tc.body), h.Get("Retry-After"), h.Get("Retry-After-Ms"), h.Get("X-Ratelimit-Remaining-Requests"), h.Get("X-Ratelimit-Remaining-Tokens"),
			h.Get("X-Ratelimit-Limit-Tokens"), h.Get("Anthropic-Ratelimit-Output-Tokens-Remaining"), h.Get("Anthropic-Ratelimit-Input-Tokens-Reset"), tc.cost.Requests, tc.cost.Tokens)
	}
	f.Add([]byte(`{"error":{"message":"limit: 0","details":[{"@type":"google.rpc.RetryInfo","retryDelay":"1e99s"}]}}`), "-1", "NaN", "-5", "1e400", "0", "0", "not a time", -3, -1<<62)
	now := rlNow
	f.Fuzz(func(t *testing.T, body []byte, ra, raMS, remReq, remTok, limTok, outRem, reset string, costReq, costTok int) {
		h := http.Header{}
		set := func(k, v string) {
			if v != "" {
				h.Set(k, v)
			}
		}
		set("Retry-After", ra)
		set("Retry-After-Ms", raMS)
		set("X-Ratelimit-Remaining-Requests", remReq)
		set("X-Ratelimit-Remaining-Tokens", remTok)
		set("X-Ratelimit-Limit-Tokens", limTok)
		set("Anthropic-Ratelimit-Output-Tokens-Remaining", outRem)
		set("Anthropic-Ratelimit-Input-Tokens-Remaining", remTok)
		set("Anthropic-Ratelimit-Input-Tokens-Reset", reset)
		set("X-Rate-Limit-Reset-Tokens", reset)
		set("Policy-Id", ra)
		cost := Cost{Requests: costReq, Tokens: costTok}
		check := func(o Outcome) {
			got := ClassifyRateLimit(o, h, cost, now)
			if !slices.Contains(RateLimitKinds, got.Kind) {
				t.Fatalf("kind %q not a RateLimitKind", got.Kind)
			}
			switch got.Dimension {
			case "", "requests", "tokens", "output_tokens":
			default:
				t.Fatalf("dimension %q", got.Dimension)
			}
			if got.RetryAfter < 0 || got.RetryAfter > maxHint {
				t.Fatalf("retry after %v", got.RetryAfter)
			}
			if got.StatedLimitRequests < -1 || got.StatedLimitTokens < -1 {
				t.Fatalf("stated limits %d %d", got.StatedLimitRequests, got.StatedLimitTokens)
			}
			if got.Kind == LimitMinute && got.Dimension == "" && got.RateLimit.RemainingRequests >= 0 && got.RateLimit.RemainingTokens >= 0 {
				t.Fatalf("minute from headers without a dimension: %+v", got)
			}
		}
		for _, status := range []int{429, 402, 503} {
			o := Classify(&Response{Status: status, Header: h, Body: body}, nil, now)
			if o.RetryDelay < 0 || o.RetryDelay > maxHint {
				t.Fatalf("retry delay %v", o.RetryDelay)
			}
			check(o)
		}
		// The untruncated body as message and quota ids.
		check(Outcome{Class: Retry, HTTPStatus: 429, Message: string(body), Quota: string(body), LimitType: string(body)})
	})
}
