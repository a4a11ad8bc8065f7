package provider

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// RateLimitKind is what a 429 says about the limit that refused the call.
type RateLimitKind string

// The kinds of rate-limit refusal.
const (
	// LimitBurst: a per-second (short-window) limit; the minute still had
	// room for the request (OpenAI's quantization, Azure's 1- and 10-s
	// windows).
	LimitBurst RateLimitKind = "burst"
	// LimitMinute: the per-minute window is spent for the dimension.
	LimitMinute RateLimitKind = "minute"
	// LimitConcurrency: too many requests in flight.
	LimitConcurrency RateLimitKind = "concurrency"
	// LimitAcceleration: usage rose too fast (Anthropic's acceleration
	// limits on sharp ramps).
	LimitAcceleration RateLimitKind = "acceleration"
	// LimitQuota: quota, billing, spend limits, per-day quotas: operator
	// action, never adapted to or retried as a rate.
	LimitQuota RateLimitKind = "quota"
	// LimitUnknown: a 429 that says nothing more.
	LimitUnknown RateLimitKind = "unknown"
)

// Cost is what the refused request would have been charged.
type Cost struct{ Requests, Tokens int }

// RateLimitInfo is a classified 429.
type RateLimitInfo struct {
	Kind RateLimitKind
	// Dimension is "requests", "tokens", or "" when the provider did not
	// say.
	Dimension  string
	RateLimit  RateLimit
	RetryAfter time.Duration
	// StatedLimitRequests and StatedLimitTokens are per-minute limits the
	// provider states, in headers or in its message; -1 when it does not.
	StatedLimitRequests, StatedLimitTokens int
}

// statedRe matches OpenAI's "... on tokens per min (TPM): Limit 150000, Used
// 149000, Requested 5000." and the requests form.
var statedRe = regexp.MustCompile(`(?i)on (requests|tokens) per min(?:ute)?\b[^:]*:\s*limit\s+([0-9]+)`)

// retryInRe matches Gemini's "Please retry in 46s." / "retry in 1.5s".
var retryInRe = regexp.MustCompile(`(?i)retry in ([0-9]+(?:\.[0-9]+)?)s\b`)

// ClassifyRateLimit places a 429 (o as Classify made it, h the response's
// headers, cost what the refused request would have been charged).
func ClassifyRateLimit(o Outcome, h http.Header, cost Cost, now time.Time) RateLimitInfo {
	rl := ParseRateLimit(h, now)
	info := RateLimitInfo{Kind: LimitUnknown, Dimension: o.LimitType, RateLimit: rl, RetryAfter: o.RetryAfter,
		StatedLimitRequests: rl.LimitRequests, StatedLimitTokens: rl.LimitTokens}
	if info.RetryAfter == 0 {
		if m := retryInRe.FindStringSubmatch(o.Message); m != nil {
			if f, err := strconv.ParseFloat(m[1], 64); err == nil && f > 0 && f < 86400 {
				info.RetryAfter = time.Duration(f * float64(time.Second))
			}
		}
	}
	msg := strings.ToLower(o.Message)
	code := strings.ToLower(o.Code)
	if m := statedRe.FindStringSubmatch(o.Message); m != nil {
		if n, err := strconv.Atoi(m[2]); err == nil && n > 0 {
			if strings.EqualFold(m[1], "requests") {
				if info.StatedLimitRequests < 0 {
					info.StatedLimitRequests = n
				}
				info.Dimension = "requests"
			} else {
				if info.StatedLimitTokens < 0 {
					info.StatedLimitTokens = n
				}
				info.Dimension = "tokens"
			}
		}
	}
	perDay := strings.Contains(msg, "per day") || strings.Contains(msg, "(rpd)") || strings.Contains(msg, "(tpd)") || strings.Contains(msg, "perday")
	perMinute := strings.Contains(msg, "per min") || strings.Contains(msg, "(rpm)") || strings.Contains(msg, "(tpm)") || strings.Contains(msg, "perminute")
	switch {
	case o.Class == OperatorAction, strings.Contains(code, "insufficient_quota"), strings.Contains(code, "billing"),
		strings.Contains(msg, "billing"), strings.Contains(msg, "spend limit"), perDay,
		strings.Contains(msg, "quota") && !perMinute:
		// Gemini names per-minute limits "quota" too; those are rates.
		info.Kind = LimitQuota
		return info
	case strings.Contains(msg, "concurren"):
		info.Kind = LimitConcurrency
		return info
	case strings.Contains(msg, "acceleration"):
		info.Kind = LimitAcceleration
		return info
	}
	// What remains of the minute for each dimension, when the headers say.
	anthropicOut := strings.TrimSpace(h.Get("Anthropic-Ratelimit-Output-Tokens-Remaining"))
	spent := func(dim string) (known, out bool) {
		switch dim {
		case "requests":
			if rl.RemainingRequests >= 0 {
				return true, rl.RemainingRequests < max(cost.Requests, 1)
			}
		case "tokens":
			if anthropicOut == "0" {
				return true, true
			}
			if rl.RemainingTokens >= 0 {
				return true, rl.RemainingTokens < max(cost.Tokens, 1)
			}
		}
		return false, false
	}
	dims := []string{info.Dimension}
	if info.Dimension == "" {
		dims = []string{"requests", "tokens"}
	}
	anyKnown := false
	for _, d := range dims {
		known, out := spent(d)
		anyKnown = anyKnown || known
		if out {
			info.Kind = LimitMinute
			if info.Dimension == "" {
				info.Dimension = d
			}
			return info
		}
	}
	if anyKnown {
		info.Kind = LimitBurst // the minute had room: a shorter window refused it
		return info
	}
	switch {
	case perMinute:
		info.Kind = LimitMinute
	case o.RetryAfter > 0 && o.RetryAfter <= 2*time.Second:
		info.Kind = LimitBurst
	}
	return info
}
