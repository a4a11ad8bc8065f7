package provider

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/internal/wire"
)

func FuzzClassify(f *testing.F) {
	for _, tc := range classCases {
		f.Add(tc.status, []byte(tc.body), tc.header.Get("Retry-After"), tc.header.Get("Retry-After-Ms"), tc.header.Get("X-Ratelimit-Remaining-Tokens"), tc.header.Get("X-Should-Retry"))
	}
	f.Add(429, []byte(`[`), "Wed, 21 Oct 2015 07:28:00 GMT", "1e400", "-1", "TRUE")
	f.Add(-1, []byte(`{"error":{"error":{"error":null}}}`), "\x00", "NaN", "9999999999999999999", "")
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, status int, body []byte, ra, raMS, remaining, should string) {
		h := http.Header{}
		h.Set("Retry-After", ra)
		h.Set("Retry-After-Ms", raMS)
		h.Set("X-Ratelimit-Remaining-Tokens", remaining)
		h.Set("X-Ratelimit-Reset-Tokens", ra)
		h.Set("Anthropic-Ratelimit-Tokens-Reset", ra)
		h.Set("X-Should-Retry", should)
		o := Classify(&Response{Status: status, Header: h, Body: body}, nil, now)
		if (o.Class == Success) != (status >= 200 && status <= 299) {
			t.Fatalf("status %d classified %v", status, o.Class)
		}
		if o.Class.String() == "" || o.Class < Unknown || o.Class > ConnectFailed {
			t.Fatalf("bad class %d", o.Class)
		}
		if utf8.RuneCountInString(o.Message) > maxMessage+1 || !utf8.ValidString(o.Message) {
			t.Fatalf("message not clipped or not UTF-8: %q", o.Message)
		}
		if o.RetryAfter < 0 || o.RetryAfter > maxHint {
			t.Fatalf("retry after %v", o.RetryAfter)
		}
		rl := ParseRateLimit(h, now)
		if rl.ResetTokens < 0 || rl.ResetTokens > maxHint || rl.RemainingTokens < -1 {
			t.Fatalf("ratelimit %+v", rl)
		}
		_ = ParseUsage(body)
	})
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"", "3", "1.5", "-5", "garbage", "Wed, 21 Oct 2015 07:28:00 GMT", "1e300", "NaN", "0x10", "+Inf", " 7 "} {
		f.Add(s, s)
	}
	f.Add("2", "250")
	now := time.Date(2015, 10, 21, 7, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, ra, raMS string) {
		h := http.Header{}
		h.Set("Retry-After", ra)
		h.Set("Retry-After-Ms", raMS)
		if d := ParseRetryAfter(h, now); d < 0 || d > maxHint {
			t.Fatalf("ParseRetryAfter(%q, %q) = %v", ra, raMS, d)
		}
		if d, ok := parseResetDuration(ra); ok && (d < 0 || d > maxHint) {
			t.Fatalf("parseResetDuration(%q) = %v", ra, d)
		}
	})
}

func FuzzAnthropicConversion(f *testing.F) {
	f.Add([]byte(chatBody))
	f.Add([]byte(anthropicMessage))
	f.Add([]byte(antErr("rate_limit_error", "slow")))
	f.Add([]byte(`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]},{"role":"tool","content":[{"type":"text","text":"x"}]}],"tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false,"tools":[{"function":{"name":"f","parameters":null}}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:;base64,"}}]}]}`))
	now := time.Unix(0, 0)
	f.Fuzz(func(t *testing.T, body []byte) {
		if out, err := wire.ChatToAnthropic(body, ""); err == nil && !json.Valid(out) {
			t.Fatalf("invalid request JSON: %s", out)
		}
		if out, _, err := wire.AnthropicToChat(body, now); err == nil && !json.Valid(out) {
			t.Fatalf("invalid response JSON: %s", out)
		}
		if out, ok := wire.AnthropicErrorToOpenAI(body); ok && !json.Valid(out) {
			t.Fatalf("invalid error JSON: %s", out)
		}
	})
}

// FuzzParseUsage: whatever a provider's body says, usage is never negative
// (a counter would panic) and adds up.
func FuzzParseUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":-1099511627776,"completion_tokens":-5,"total_tokens":-1}}`))
	f.Add([]byte(`{"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":9223372036854775807}}`))
	f.Add([]byte(`{"usage":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		u := ParseUsage(body)
		if u.PromptTokens < 0 || u.CompletionTokens < 0 || u.TotalTokens < 0 || u.CachedTokens < 0 {
			t.Fatalf("negative usage %+v from %q", u, body)
		}
		if u.TotalTokens < u.PromptTokens+u.CompletionTokens || u.CachedTokens > u.PromptTokens {
			t.Fatalf("usage %+v does not add up", u)
		}
	})
}

// FuzzParseRateLimit: any header values give counts of -1 (absent) or
// more, and resets within [0, 24 h].
func FuzzParseRateLimit(f *testing.F) {
	f.Add("60", "59", "1s", "6m0s", "2026-11-30T20:00:00Z")
	f.Add("-5", "1e308", "1d2h", "-1s", "not a time")
	f.Add("NaN", "+Inf", "99999999999999999999s", "0.5", "")
	f.Fuzz(func(t *testing.T, limit, remaining, resetReq, resetTok, anthropicReset string) {
		h := http.Header{}
		h.Set("x-ratelimit-limit-requests", limit)
		h.Set("x-ratelimit-remaining-requests", remaining)
		h.Set("x-ratelimit-limit-tokens", remaining)
		h.Set("x-ratelimit-reset-requests", resetReq)
		h.Set("x-ratelimit-reset-tokens", resetTok)
		h.Set("anthropic-ratelimit-tokens-reset", anthropicReset)
		h.Set("anthropic-ratelimit-requests-limit", limit)
		rl := ParseRateLimit(h, time.Date(2026, 11, 30, 19, 0, 0, 0, time.UTC))
		for _, n := range []int{rl.LimitRequests, rl.LimitTokens, rl.RemainingRequests, rl.RemainingTokens} {
			if n < -1 {
				t.Fatalf("count %d below -1 in %+v", n, rl)
			}
		}
		for _, d := range []time.Duration{rl.ResetRequests, rl.ResetTokens} {
			if d < 0 || d > maxHint {
				t.Fatalf("reset %s outside [0, %s] in %+v", d, maxHint, rl)
			}
		}
	})
}

// FuzzBatchAnswers: what a provider's Batch API answers (batch objects and
// result lines) never panics a parser, and a parsed result is one of the
// four outcomes, with a custom id; an errored one is never classified as a
// success.
func FuzzBatchAnswers(f *testing.F) {
	for _, s := range []string{
		`{"id":"batch_1","status":"failed","errors":{"data":[{"code":"token_limit_exceeded","message":"m","line":null}]}}`,
		`{"id":"msgbatch_1","processing_status":"ended","request_counts":{"processing":0,"succeeded":2},"results_url":"http://x/r"}`,
		`{"custom_id":"a","response":{"status_code":200,"body":{"usage":{"prompt_tokens":3}}},"error":null}`,
		`{"custom_id":"a","response":{"status_code":400,"body":{"error":{"type":"invalid_request_error"}}}}`,
		`{"custom_id":"a","response":null,"error":{"code":"batch_expired"}}`,
		`{"custom_id":"a","result":{"type":"succeeded","message":{"type":"message","content":[],"usage":{}}}}`,
		`{"custom_id":"a","result":{"type":"errored","error":{"type":"error","error":{"type":"overloaded_error"}}}}`,
		`{"custom_id":"a","result":{"type":"canceled"}}`,
		`{"custom_id":"a","response":{"status_code":-7}}`,
	} {
		f.Add([]byte(s))
	}
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseOpenAIBatch(b)
		_, _ = parseAnthropicBatch(b)
		for _, parse := range []func([]byte) (BatchResult, error){parseOpenAIResult, func(b []byte) (BatchResult, error) { return parseAnthropicResult(b, now) }} {
			r, err := parse(b)
			if err != nil {
				continue
			}
			if r.CustomID == "" || r.Result < LineSucceeded || r.Result > LineCancelled {
				t.Fatalf("result %+v", r)
			}
			if r.Result == LineErrored && r.Outcome.Class == Success {
				t.Fatalf("an errored line classified a success: %+v", r)
			}
		}
	})
}
