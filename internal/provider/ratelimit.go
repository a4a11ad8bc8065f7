package provider

import (
	"net/http"
	"regexp"
	"strings"
	"time"
)

// RateLimitKind says which kind of limit a 429 hit, and so how the pacer
// should react to it.
type RateLimitKind string

const (
	// LimitBurst: a per-second or other short-window limit. The minute
	// window still had room for this request (OpenAI enforces "60,000
	// requests/minute" as 1,000 per second; Azure evaluates RPM over 1- or
	// 10-second windows). Smooth the sending; the minute limit is right.
	LimitBurst RateLimitKind = "burst"
	// LimitMinute: the per-minute window is spent for Dimension (its
	// remaining count is below this request's cost), or the message names a
	// per-minute limit and no remaining headers came back.
	LimitMinute RateLimitKind = "minute"
	// LimitConcurrency: too many requests in flight at once.
	LimitConcurrency RateLimitKind = "concurrency"
	// LimitAcceleration: Anthropic's acceleration limit, a 429 on a sharp
	// ramp even below the published limits. Ramp up more gently.
	LimitAcceleration RateLimitKind = "acceleration"
	// LimitQuota: out of quota, credits or budget, a spend limit, or a
	// per-day (or longer) quota. Waiting a minute does not help: never adapt
	// the pacing to it; only an operator can fix it.
	LimitQuota RateLimitKind = "quota"
	// LimitUnknown: a 429 we cannot place (no headers, a generic message,
	// no short wait).
	LimitUnknown RateLimitKind = "unknown"
)

// RateLimitKinds lists every kind, e.g. to pre-register metric label values.
var RateLimitKinds = []RateLimitKind{LimitBurst, LimitMinute, LimitConcurrency, LimitAcceleration, LimitQuota, LimitUnknown}

// Cost is what one request charges against the provider's limits: Requests
// (normally 1) and Tokens as the provider counts them at arrival (prompt +
// max_tokens; on Anthropic the input alone, and Output its max_tokens).
// Zero values count as 1.
type Cost struct {
	Requests int
	Tokens   int
	Output   int
}

// RateLimitInfo is what a 429 says about the limit it hit.
type RateLimitInfo struct {
	Kind RateLimitKind
	// Dimension is "requests", "tokens", "output_tokens" (Anthropic's
	// output tokens, limited apart; "tokens" is then its input) or "" (not
	// known).
	Dimension string
	// RateLimit is ParseRateLimit of the response headers.
	RateLimit RateLimit
	// RetryAfter is the wait the provider asked for: the Retry-After headers,
	// else the body's (Outcome.RetryDelay, or a wait stated in the message),
	// else Azure's x-rate-limit-reset-{tokens,requests}; 0 if none.
	RetryAfter time.Duration
	// StatedLimitRequests and StatedLimitTokens are the per-minute limits the
	// provider states: x-ratelimit-limit-* / anthropic-ratelimit-*-limit
	// headers (ignored on Azure, whose windows may be 10 s), else a per-minute
	// message ("on tokens per min (TPM): Limit 30000, Used ...", "of 50,000
	// input tokens per minute"). -1 when not stated. StatedLimitOutput is
	// Anthropic's output-token limit (anthropic-ratelimit-output-tokens-limit).
	StatedLimitRequests, StatedLimitTokens, StatedLimitOutput int
}

// Thresholds on the wait a provider asks for.
const (
	// burstWait: a wait this short, with no other clue, is a short window.
	burstWait = 2 * time.Second
	// windowWait: the longest wait a per-minute window asks for.
	windowWait = time.Minute
	// quotaWait: no minute, burst or concurrency limit asks for this long.
	quotaWait = time.Hour
)

// ClassifyRateLimit places a throttling outcome (a 429, or any Outcome
// Classify made Retry or OperatorAction) among the RateLimitKinds; other
// outcomes get a kind too, but it means nothing. o is
// Classify's answer, h the response headers, cost what the request would
// have charged. Rules, first match wins:
//
//  1. quota: o.Class is OperatorAction, o.Code is one of Rules' money codes
//     (insufficient_quota, billing_*, spend_limit_exceeded...), the message
//     or Google quota ids name a per-day or monthly quota, a spend, usage or
//     credit limit, or a limit of 0 ("limit: 0", "Limit 0, Used 0"; header
//     limits of 0 do not count); a wait of an hour or more; a message about
//     an exceeded quota with a wait longer than a minute.
//  2. concurrency ("concurrent requests", "concurrent connections", "too many
//     concurrent", "concurrency limit"), then acceleration ("acceleration"),
//     by message, case-insensitively.
//  3. with remaining headers for Dimension (both dimensions when it is not
//     known): x-ratelimit-remaining-{requests,tokens} (OpenAI, Azure),
//     anthropic-ratelimit-{requests,input-tokens,tokens}-remaining: below
//     the request's cost → minute (and Dimension is the spent one);
//     anthropic-ratelimit-output-tokens-remaining below the request's
//     output (0 when its output is not known) → minute, output_tokens;
//     otherwise → burst: the minute had room, a shorter window refused.
//  4. without them: a per-minute message → minute, unless it states
//     "Limit L, Used U, Requested R" with L-U ≥ R (room left → burst); a
//     Google per-minute quota id → minute; a message about quota with a wait
//     of at most a minute (Gemini's "Please retry in 46s") → minute; a wait
//     under 2 s → burst; else unknown.
//
// Dimension is o.LimitType (the body's type, the message, headers at 0),
// else what Google quota ids, the message ("token rate limit", "call rate
// limit", "request tokens"...) or Azure's policy-id name. It never panics,
// whatever the input.
func ClassifyRateLimit(o Outcome, h http.Header, cost Cost, now time.Time) RateLimitInfo {
	rl := ParseRateLimit(h, now)
	info := RateLimitInfo{Kind: LimitUnknown, RateLimit: rl, StatedLimitRequests: -1, StatedLimitTokens: -1, StatedLimitOutput: rl.LimitOutput}
	info.RetryAfter = firstPositive(ParseRetryAfter(h, now), o.RetryAfter, o.RetryDelay, messageWait(o.Message), azureResetWait(h))

	msg := strings.ToLower(o.Message)
	ids := googleQuotaIDs(o.Quota)
	mm := parseMinuteMessage(o.Message)

	if !isAzure(h) {
		info.StatedLimitRequests, info.StatedLimitTokens = rl.LimitRequests, rl.LimitTokens
	}
	switch {
	case mm.dim == "requests" && info.StatedLimitRequests < 0:
		info.StatedLimitRequests = mm.limit
	case mm.dim == "tokens" && info.StatedLimitTokens < 0:
		info.StatedLimitTokens = mm.limit
	}
	info.Dimension = limitDimension(o, msg, ids, h)

	switch {
	case isQuota(o, msg, ids, info):
		info.Kind = LimitQuota
	case containsAny(msg, "concurrent request", "concurrent connection", "too many concurrent", "concurrency limit"):
		info.Kind = LimitConcurrency
	case strings.Contains(msg, "acceleration"):
		info.Kind = LimitAcceleration
	default:
		info.Kind = byWindow(&info, h, cost, msg, ids, mm)
	}
	return info
}

// byWindow applies rules 3 and 4 of ClassifyRateLimit; it may set
// info.Dimension.
func byWindow(info *RateLimitInfo, h http.Header, cost Cost, msg string, ids []string, mm minuteMessage) RateLimitKind {
	if kind, spent, ok := byRemaining(info.RateLimit, h, info.Dimension, cost); ok {
		if spent != "" {
			info.Dimension = spent
		}
		return kind
	}
	if mm.dim != "" {
		if info.Dimension == "" {
			info.Dimension = mm.dim
		}
		if mm.used >= 0 {
			need := mm.requested
			if need < 0 {
				need = costIn(cost, mm.dim)
			}
			if mm.limit-mm.used >= need {
				return LimitBurst
			}
		}
		return LimitMinute
	}
	if containsAny(msg, "per min", "per-min", "perminute", "(rpm)", "(tpm)") || firstWith(ids, "perminute") != "" {
		return LimitMinute
	}
	if quotaWords(msg) && info.RetryAfter > 0 && info.RetryAfter <= windowWait {
		return LimitMinute
	}
	if info.RetryAfter > 0 && info.RetryAfter < burstWait {
		return LimitBurst
	}
	return LimitUnknown
}

// byRemaining is rule 3: ok is false when no remaining header for dim (for
// either dimension when dim is "") came back.
func byRemaining(rl RateLimit, h http.Header, dim string, cost Cost) (kind RateLimitKind, spent string, ok bool) {
	present := false
	if dim == "" || dim == "requests" {
		if r := rl.RemainingRequests; r >= 0 {
			present = true
			if r < costIn(cost, "requests") {
				return LimitMinute, "requests", true
			}
		}
	}
	if dim == "" || dim == "tokens" {
		if r := rl.RemainingTokens; r >= 0 {
			present = true
			if r < costIn(cost, "tokens") {
				return LimitMinute, "tokens", true
			}
		}
	}
	if dim == "" || dim == "tokens" || dim == "output_tokens" {
		// Output tokens are charged max_tokens at arrival; without the
		// request's output only an empty bucket is a sure sign.
		if r := rl.RemainingOutput; r >= 0 {
			present = true
			if r < max(cost.Output, 1) {
				return LimitMinute, "output_tokens", true
			}
		}
	}
	if present {
		return LimitBurst, "", true
	}
	return "", "", false
}

// costIn is the request's cost in a dimension, at least 1.
func costIn(c Cost, dim string) int {
	if dim == "requests" {
		return max(c.Requests, 1)
	}
	return max(c.Tokens, 1)
}

// isQuota is rule 1.
func isQuota(o Outcome, msg string, ids []string, info RateLimitInfo) bool {
	if o.Class == OperatorAction {
		return true
	}
	for _, r := range Rules {
		if r.Class != OperatorAction || o.Code == "" {
			continue
		}
		if (r.Code != "" && strings.EqualFold(o.Code, r.Code)) || (r.Type != "" && strings.EqualFold(o.Code, r.Type)) {
			return true
		}
	}
	switch {
	case containsAny(msg, "per day", "per-day", "perday", "(rpd)", "(tpd)", "daily", "per month", "monthly",
		"spend limit", "spending limit", "usage limit", "credit balance", "insufficient_quota", "billing_hard_limit"):
		return true
	case firstWith(ids, "perday") != "":
		return true
	case zeroLimit.MatchString(msg):
		return true
	case info.RetryAfter >= quotaWait:
		return true
	case quotaWords(msg) && info.RetryAfter > windowWait:
		return true
	}
	return false
}

// zeroLimit matches a (lower-cased) message stating a limit of 0 ("limit:
// 0, model: gemini-2.5-pro", "Limit 0, Used 0, Requested 1"): the request
// can never pass, so it is a quota matter. Header limits of 0 are not
// trusted to mean that.
var zeroLimit = regexp.MustCompile(`\blimit:?\s*0(?:[,;)\s]|\.(?:[^0-9]|$)|$)`)

// quotaWords reports whether a (lower-cased) message says a quota was
// exceeded (Gemini: "You exceeded your current quota", "Quota exceeded for
// metric", "Resource has been exhausted (e.g. check quota)"). A bare
// "quota" is not enough: Azure links to .../quotaincrease on every 429.
func quotaWords(msg string) bool {
	return containsAny(msg, "quota exceeded", "exceeded your current quota", "exceeded quota", "check quota", "quota metric")
}

// limitDimension picks Dimension before the kind is known.
func limitDimension(o Outcome, msg string, ids []string, h http.Header) string {
	switch o.LimitType {
	case "requests", "tokens":
		return o.LimitType
	}
	for _, id := range []string{firstWith(ids, "perday"), firstWith(ids, "perminute"), firstWith(ids, "")} {
		if d := idDimension(id); d != "" {
			return d
		}
	}
	switch {
	case strings.Contains(msg, "output tokens"):
		return "output_tokens"
	case containsAny(msg, "request tokens", "input tokens", "tokens per", "token rate limit", "(tpm)", "(tpd)", "token_count"):
		return "tokens"
	case containsAny(msg, "requests per", "number of requests", "call rate limit", "request rate limit", "(rpm)", "(rpd)", "_requests"):
		return "requests"
	}
	// Azure names the policy that refused: "DeploymentRatelimit-Token" has
	// been seen; "-Call" is assumed by analogy with its "call rate limit".
	if p := strings.ToLower(h.Get("Policy-Id")); strings.Contains(p, "ratelimit") {
		switch {
		case strings.HasSuffix(p, "-token"):
			return "tokens"
		case strings.HasSuffix(p, "-call"), strings.HasSuffix(p, "-request"):
			return "requests"
		}
	}
	return ""
}

// idDimension reads a Google quota id ("GenerateContentInputTokensPerModelPerMinute-FreeTier").
func idDimension(id string) string {
	switch {
	case strings.Contains(id, "token"):
		return "tokens"
	case strings.Contains(id, "request"):
		return "requests"
	}
	return ""
}

// googleQuotaIDs splits Outcome.Quota, lower-cased.
func googleQuotaIDs(q string) []string {
	if q == "" {
		return nil
	}
	return strings.Split(strings.ToLower(q), ",")
}

// firstWith returns the first id containing sub ("" matches any), or "".
func firstWith(ids []string, sub string) string {
	for _, id := range ids {
		if strings.Contains(id, sub) {
			return id
		}
	}
	return ""
}

// isAzure recognises an Azure OpenAI response by the headers it adds.
// Azure's x-ratelimit-limit-* (when sent at all) may describe a 10-second
// window, so they are not reported as per-minute limits.
func isAzure(h http.Header) bool {
	return h.Get("Apim-Request-Id") != "" || h.Get("X-Ms-Region") != "" || h.Get("Azureml-Model-Session") != ""
}

// azureResetWait reads Azure's x-rate-limit-reset-{tokens,requests}
// (seconds), sent on some 429s in place of Retry-After.
func azureResetWait(h http.Header) time.Duration {
	for _, n := range []string{"X-Rate-Limit-Reset-Tokens", "X-Rate-Limit-Reset-Requests"} {
		if v := strings.TrimSpace(h.Get(n)); v != "" {
			if d, ok := parseResetDuration(v); ok && d > 0 {
				return d
			}
		}
	}
	return 0
}

// minuteMessage is a per-minute limit a message states; dim is "" when the
// message states none. used and requested are -1 when not stated.
type minuteMessage struct {
	dim                    string
	limit, used, requested int
}

// countRE is a count as messages write it: "150000", "50,000",
// "150000.000000". Thousands separators must group by three, so the comma
// after a number ("Limit 3, Used 3") is not taken into it.
const countRE = `(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?`

var (
	// OpenAI: "on tokens per min (TPM): Limit 30000, Used 18928, Requested
	// 11159.", "on tokens per min (TPM): Limit 30000, Requested 30601.",
	// and the older "on requests per min. Limit: 3 / min.".
	openAIMinuteMsg = regexp.MustCompile(`(?i)\b(requests|tokens)\s+per\s+min(?:ute)?\b(?:\s*\((?:rpm|tpm)\))?\s*[:.]?\s*limit:?\s*(` + countRE + `)(?:\s*/\s*min)?(?:\s*[,.]\s*used:?\s*(` + countRE + `))?(?:\s*[,.]\s*requested:?\s*(` + countRE + `))?`)
	// Anthropic: "would exceed the rate limit for your organization (...) of
	// 50,000 input tokens per minute". Output-token limits are left out.
	anthropicMinuteMsg = regexp.MustCompile(`(?i)\bof\s+(` + countRE + `)\s+(input\s+tokens|tokens|requests)\s+per\s+minute\b`)
)

// parseMinuteMessage reads a per-minute limit stated in a message.
func parseMinuteMessage(msg string) minuteMessage {
	if m := openAIMinuteMsg.FindStringSubmatch(msg); m != nil {
		if limit := parseCount(m[2]); limit >= 0 {
			return minuteMessage{dim: strings.ToLower(m[1]), limit: limit, used: parseCount(m[3]), requested: parseCount(m[4])}
		}
	}
	if m := anthropicMinuteMsg.FindStringSubmatch(msg); m != nil {
		if limit := parseCount(m[1]); limit >= 0 {
			dim := "tokens"
			if strings.EqualFold(m[2], "requests") {
				dim = "requests"
			}
			return minuteMessage{dim: dim, limit: limit, used: -1, requested: -1}
		}
	}
	return minuteMessage{used: -1, requested: -1}
}

// parseCount parses "150,000" or "150000.000000"; -1 for "" or anything
// out of range.
func parseCount(s string) int {
	s = strings.ReplaceAll(s, ",", "")
	if s == "" {
		return -1
	}
	f, ok := parseFloat(s)
	if !ok || f < 0 || f >= 1<<31 {
		return -1
	}
	return int(f)
}

var (
	// "Please try again in 1.5s", "try again in 7m12s", "Please retry in
	// 46.114142718s."
	waitGoDuration = regexp.MustCompile(`(?i)\b(?:try again|retry)\s+in\s+((?:[0-9]+(?:\.[0-9]+)?(?:ns|us|µs|ms|s|m|h))+)\b`)
	// "Please retry after 6 seconds.", "try again in 2 minutes".
	waitWords = regexp.MustCompile(`(?i)\b(?:try again|retry)\s+(?:in|after)\s+([0-9]+(?:\.[0-9]+)?)\s*(seconds?|secs?|minutes?|mins?|hours?)\b`)
)

// messageWait is the wait a message asks for, capped at 24 h; 0 if none.
func messageWait(msg string) time.Duration {
	if m := waitGoDuration.FindStringSubmatch(msg); m != nil {
		if d, err := time.ParseDuration(m[1]); err == nil && d > 0 {
			return min(d, maxHint)
		}
	}
	if m := waitWords.FindStringSubmatch(msg); m != nil {
		n, ok := parseFloat(m[1])
		if !ok || n <= 0 {
			return 0
		}
		unit := time.Second
		switch strings.ToLower(m[2])[0] {
		case 'm':
			unit = time.Minute
		case 'h':
			unit = time.Hour
		}
		return clampHint(n * float64(unit))
	}
	return 0
}

func firstPositive(ds ...time.Duration) time.Duration {
	for _, d := range ds {
		if d > 0 {
			return d
		}
	}
	return 0
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
