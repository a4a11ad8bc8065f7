package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Class is what the executor should do with an outcome. The zero value is
// Unknown, so a forgotten Outcome is never mistaken for a success.
type Class int

const (
	// Unknown: the request may have been processed; the caller applies its
	// reconciliation policy. Never retried blindly.
	Unknown Class = iota
	// Success: a 2xx response.
	Success
	// Retry: temporary throttling; retry no sooner than Retry-After.
	Retry
	// Overloaded: the provider is struggling; retry with backoff while the
	// deadline allows.
	Overloaded
	// OperatorAction: quota, billing or spend limits. Fail at once, never
	// retry, surface loudly: only a human can fix it.
	OperatorAction
	// Fail: the request itself is wrong (400, context length, policy, unknown
	// model, 422...). No retry can fix it.
	Fail
	// AuthBroken: 401/403. Fail and mark the credential broken.
	AuthBroken
	// ConnectFailed: the request never left (dial, TLS, connect timeout).
	// Safe to retry with backoff.
	ConnectFailed
)

// Classes lists every class, e.g. to pre-register metric label values.
var Classes = []Class{Unknown, Success, Retry, Overloaded, OperatorAction, Fail, AuthBroken, ConnectFailed}

// String returns the class's stable snake_case name, used as the error_type
// metric label value.
func (c Class) String() string {
	switch c {
	case Unknown:
		return "unknown"
	case Success:
		return "success"
	case Retry:
		return "rate_limited"
	case Overloaded:
		return "overloaded"
	case OperatorAction:
		return "operator_action"
	case Fail:
		return "invalid"
	case AuthBroken:
		return "auth"
	case ConnectFailed:
		return "connect"
	}
	return "class_" + strconv.Itoa(int(c))
}

// Retryable reports whether Plan may schedule another attempt for the class.
func (c Class) Retryable() bool { return c == Retry || c == Overloaded || c == ConnectFailed }

// Status wildcards for Rule.Status.
const (
	StatusAny = 0 // any status
	Status2xx = 2 // 200-299
	Status3xx = 3 // 300-399
	Status4xx = 4 // 400-499
	Status5xx = 5 // 500-599
)

// Rule is one row of the classification table. A row matches when every
// non-empty field matches; the first matching row wins.
type Rule struct {
	// Phase, when set, makes the row match a *TransportError of that phase
	// (the other match fields are then ignored). Rows without a Phase match
	// HTTP responses.
	Phase Phase
	// Status is an exact HTTP status, StatusAny, or Status2xx..Status5xx.
	Status int
	// Type matches the error body's type field (OpenAI error.type, Anthropic
	// error.type).
	Type string
	// Code matches the error body's code field — or its type field, since
	// providers disagree on which one carries the identifier.
	Code string
	// Message matches a case-insensitive substring of the error message.
	Message string
	Class   Class
	// Safe sets Outcome.SafeToRetry: the provider certainly did not process
	// the request.
	Safe bool
	Note string
}

// Rules is the classification table, for OpenAI-compatible APIs and the
// Anthropic Messages API. Classify walks it in order; ClassTable renders it.
// It is the only place classification decisions live; the one adjustment
// made outside it is that an "x-should-retry: true|false" response header
// overrides the row's Safe (never its Class).
var Rules = []Rule{
	// Transport failures (see Phase).
	{Phase: PhaseBuild, Class: Fail, Safe: true, Note: "request could not be built (bad base URL, unconvertible body); nothing was sent"},
	{Phase: PhaseConnect, Class: ConnectFailed, Safe: true, Note: "dial, TLS or connect timeout, or no byte written: the request never left"},
	{Phase: PhaseAwaitHeaders, Class: Unknown, Note: "sent, but no headers (header timeout, reset, EOF): outcome unknown, reconcile"},
	{Phase: PhaseBody, Class: Unknown, Note: "body cut or too large: the provider almost surely did the work (WorkDone)"},
	{Phase: PhaseStreamStart, Class: Overloaded, Note: "a stream broke or timed out before its first token: the caller saw nothing; retried (after the first token: interrupted, never retried)"},

	{Status: Status2xx, Class: Success},

	// Money: whatever the status, only an operator can fix these.
	{Code: "insufficient_quota", Class: OperatorAction, Note: "out of credits or quota (OpenAI sends 429)"},
	{Code: "billing_hard_limit_reached", Class: OperatorAction, Note: "billing hard limit"},
	{Code: "billing_not_active", Class: OperatorAction, Note: "billing inactive"},
	{Code: "usage_limit_exceeded", Class: OperatorAction, Note: "usage limit"},
	{Code: "spend_limit_exceeded", Class: OperatorAction, Note: "spend limit"},
	{Code: "budget_exceeded", Class: OperatorAction, Note: "proxy budget exhausted"},
	{Type: "billing_error", Class: OperatorAction, Note: "Anthropic billing problem"},
	{Status: 400, Message: "credit balance is too low", Class: OperatorAction, Note: "Anthropic out of credits (sent as 400 invalid_request_error)"},
	{Status: 402, Class: OperatorAction, Note: "payment required"},

	// Throttling: the provider refused before doing the work.
	{Status: 429, Code: "rate_limit_exceeded", Class: Retry, Safe: true, Note: "OpenAI RPM/TPM limit"},
	{Status: 429, Type: "rate_limit_error", Class: Retry, Safe: true, Note: "Anthropic rate limit"},
	{Code: "slow_down", Class: Retry, Safe: true, Note: "ramp up more slowly (OpenAI sends 503 or 429)"},
	{Status: 429, Class: Retry, Safe: true, Note: "unrecognized 429: treated as throttling"},
	{Status: 409, Class: Retry, Safe: true, Note: "idempotency conflict: the same key is in flight; retry to get its result"},

	// Overload.
	{Type: "overloaded_error", Class: Overloaded, Safe: true, Note: "Anthropic overloaded (529)"},
	{Status: 529, Class: Overloaded, Safe: true, Note: "overloaded"},
	{Status: 503, Code: "server_is_overloaded", Class: Overloaded, Safe: true, Note: "OpenAI overloaded"},
	{Status: 503, Class: Overloaded, Safe: true, Note: "service unavailable"},
	{Status: 408, Class: Overloaded, Safe: true, Note: "request timeout: not processed"},
	{Status: 500, Class: Overloaded, Note: "server error (Anthropic api_error); may have been processed"},
	{Status: 502, Class: Overloaded, Note: "bad gateway; may have been processed"},
	{Status: 504, Class: Overloaded, Note: "gateway timeout; may have been processed"},
	{Status: Status5xx, Class: Overloaded, Note: "other server errors"},

	// Credentials.
	{Status: 401, Code: "invalid_api_key", Class: AuthBroken, Note: "OpenAI bad key"},
	{Status: 401, Type: "authentication_error", Class: AuthBroken, Note: "Anthropic bad key"},
	{Status: 401, Class: AuthBroken, Note: "unauthorized"},
	{Status: 403, Type: "permission_error", Class: AuthBroken, Note: "Anthropic permission denied"},
	{Status: 403, Class: AuthBroken, Note: "forbidden"},

	// The request is wrong.
	{Status: 400, Code: "context_length_exceeded", Class: Fail, Note: "prompt too long for the model"},
	{Status: 400, Code: "content_policy_violation", Class: Fail, Note: "content policy"},
	{Status: 400, Code: "content_filter", Class: Fail, Note: "content filter"},
	{Status: 400, Type: "invalid_request_error", Class: Fail, Note: "invalid request"},
	{Status: 400, Class: Fail, Note: "bad request"},
	{Status: 404, Class: Fail, Note: "unknown model or endpoint"},
	{Status: 413, Class: Fail, Note: "request_too_large"},
	{Status: 422, Class: Fail, Note: "unprocessable"},
	{Status: Status4xx, Class: Fail, Note: "other client errors"},
	{Status: Status3xx, Class: Fail, Note: "unexpected redirect (not followed)"},

	{Class: Unknown, Note: "anything else (1xx, >599)"},
}

// Outcome is the classification of one call.
type Outcome struct {
	Class Class
	// Code is the provider's error code or type ("rate_limit_exceeded",
	// "insufficient_quota", "overloaded_error"...), "http_<status>" when the
	// body names none, or for transport errors one of "connect_timeout",
	// "connect_refused", "connect_failed" (these three: the endpoint cannot
	// be reached, Unreachable), "connection_closed" (a connection in hand
	// closed before the request's first byte: ErrConnLost), "send_late"
	// (ErrSendLate), "header_timeout",
	// "connection_reset", "stream_cut", "body_too_large", "invalid_request",
	// "canceled", "deadline_exceeded".
	Code string
	// Message is the provider's error message (or the transport error),
	// with key-like tokens redacted, truncated to 500 characters.
	Message    string
	HTTPStatus int
	// RetryAfter is what the Retry-After headers asked for; 0 if absent.
	RetryAfter time.Duration
	// RetryDelay is the wait the error body asks for: Google's RetryInfo
	// retryDelay, else a wait the message states ("Please try again in
	// 1.5s", "Please retry in 46.1s", "Please retry after 6 seconds"); 0 if
	// none. It is read from the whole body, before Message is truncated.
	// Plan does not use it (only RetryAfter); ClassifyRateLimit does.
	RetryDelay time.Duration
	// Quota names the quotas a Google-style error body says were exceeded
	// (QuotaFailure violations' quotaId, ErrorInfo metadata quota_limit),
	// comma-separated, e.g. "GenerateRequestsPerDayPerProjectPerModel-FreeTier";
	// empty for other providers.
	Quota string
	// LimitType is "requests", "tokens" or "" for throttling responses.
	LimitType string
	// SafeToRetry: the request certainly did not reach the provider, or the
	// provider said it did not process it (status, or x-should-retry: true).
	SafeToRetry bool
	// OutcomeUnknown: the request was sent and no answer came back.
	OutcomeUnknown bool
	// WorkDone: the response was cut mid-body; the provider almost surely did
	// (and billed) the work.
	WorkDone bool
}

// Unreachable reports an outcome that says the endpoint cannot be reached
// (refused, connect timeout, DNS, TLS, another dial failure), not one
// request's bad luck: a connection that closed before the request was
// written, a send refused as late or the caller's context are not.
func (o Outcome) Unreachable() bool {
	switch o.Code {
	case "connect_timeout", "connect_refused", "connect_failed":
		return o.Class == ConnectFailed
	}
	return false
}

// JobError converts the outcome to a result error; nil for Success.
func (o Outcome) JobError() *job.Error {
	if o.Class == Success {
		return nil
	}
	e := &job.Error{Code: o.Code, Message: o.Message, RetryAfterMS: o.RetryAfter.Milliseconds()}
	if e.Code == "" {
		e.Code = job.CodeProviderError
	}
	if e.Message == "" {
		e.Message = o.Class.String()
	}
	return e
}

const maxMessage = 500

// Classify decides what a call's result means. resp and err are what
// Client.Do returned; now is used for HTTP-date Retry-After values.
func Classify(resp *Response, err error, now time.Time) Outcome {
	if err != nil {
		return classifyError(err)
	}
	if resp == nil {
		return Outcome{Class: Unknown, Code: "no_response", OutcomeUnknown: true}
	}
	o := Outcome{HTTPStatus: resp.Status}
	var ei errInfo
	if resp.Status < 200 || resp.Status > 299 {
		ei = parseErrorBody(resp.Body)
	}
	r, _ := matchHTTP(resp.Status, ei)
	o.Class, o.SafeToRetry = r.Class, r.Safe
	if o.Class == Success {
		return o
	}
	o.Code = firstNonEmpty(ei.code, ei.typ, "http_"+strconv.Itoa(resp.Status))
	o.Message = cleanMessage(ei.msg)
	o.RetryAfter = ParseRetryAfter(resp.Header, now)
	o.RetryDelay = ei.retryDelay
	if o.RetryDelay == 0 {
		o.RetryDelay = messageWait(ei.msg)
	}
	o.Quota = ei.quota
	switch strings.ToLower(strings.TrimSpace(resp.Header.Get("X-Should-Retry"))) {
	case "true":
		o.SafeToRetry = true
	case "false":
		o.SafeToRetry = false
	}
	if resp.Status == http.StatusTooManyRequests || o.Class == Retry {
		o.LimitType = limitType(ei, resp.Header, now)
	}
	if o.Class == Unknown {
		o.OutcomeUnknown = true
	}
	return o
}

func classifyError(err error) Outcome {
	phase := PhaseAwaitHeaders // an error we do not know: assume the worst
	var te *TransportError
	if errors.As(err, &te) {
		switch te.Phase {
		case PhaseBuild, PhaseConnect, PhaseAwaitHeaders, PhaseBody, PhaseStreamStart:
			phase = te.Phase
		}
	}
	o := Outcome{Code: transportCode(phase, err), Message: cleanMessage(err.Error())}
	for _, r := range Rules {
		if r.Phase == phase {
			o.Class, o.SafeToRetry = r.Class, r.Safe
			break
		}
	}
	switch phase {
	case PhaseAwaitHeaders:
		o.OutcomeUnknown = true
	case PhaseBody:
		o.WorkDone = true
	}
	return o
}

func transportCode(phase Phase, err error) string {
	var ce *ctxError
	switch {
	case errors.As(err, &ce) && errors.Is(ce.ctx, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	switch phase {
	case PhaseBuild:
		return "invalid_request"
	case PhaseConnect:
		switch {
		case errors.Is(err, ErrSendLate):
			return "send_late"
		case errors.Is(err, ErrConnLost):
			return "connection_closed"
		case isTimeout(err):
			return "connect_timeout"
		case isRefused(err):
			return "connect_refused"
		}
		return "connect_failed"
	case PhaseAwaitHeaders:
		if isTimeout(err) {
			return "header_timeout"
		}
		return "connection_reset"
	}
	if errors.Is(err, ErrBodyTooLarge) {
		return "body_too_large"
	}
	if errors.Is(err, ErrFirstTokenTimeout) {
		return "first_token_timeout"
	}
	if errors.Is(err, ErrIdleTimeout) {
		return "idle_timeout"
	}
	return "stream_cut"
}

// matchHTTP returns the first HTTP row that matches and its index (-1 for
// none).
func matchHTTP(status int, ei errInfo) (Rule, int) {
	for i, r := range Rules {
		if r.Phase == "" && r.matches(status, ei) {
			return r, i
		}
	}
	return Rule{Class: Unknown}, -1
}

func (r Rule) matches(status int, ei errInfo) bool {
	switch {
	case r.Status == StatusAny:
	case r.Status >= Status2xx && r.Status <= Status5xx:
		if status/100 != r.Status {
			return false
		}
	case r.Status != status:
		return false
	}
	if r.Type != "" && !strings.EqualFold(r.Type, ei.typ) {
		return false
	}
	if r.Code != "" && !strings.EqualFold(r.Code, ei.code) && !strings.EqualFold(r.Code, ei.typ) {
		return false
	}
	if r.Message != "" && !strings.Contains(strings.ToLower(ei.msg), strings.ToLower(r.Message)) {
		return false
	}
	return true
}

// errInfo is what an error body says. quota and retryDelay come from
// Google-style details (see googleDetails).
type errInfo struct {
	typ, code, msg string
	quota          string
	retryDelay     time.Duration
}

// parseErrorBody reads OpenAI ({"error":{"message","type","param","code"}}),
// Anthropic ({"type":"error","error":{"type","message"}}) and the common
// variants of compatible servers (error as a string, top-level
// message/code/detail, Google-style status, a one-element array).
func parseErrorBody(body []byte) errInfo {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		var arr []json.RawMessage
		if json.Unmarshal(body, &arr) != nil || len(arr) == 0 {
			return errInfo{}
		}
		body = arr[0]
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return errInfo{}
	}
	raw, ok := top["error"]
	if !ok { // a flat body
		ei := errInfo{typ: jsonText(top["type"]), code: jsonText(top["code"]), msg: firstNonEmpty(jsonText(top["message"]), jsonText(top["detail"]))}
		if ei.typ == "error" {
			ei.typ = ""
		}
		return ei
	}
	var inner map[string]json.RawMessage
	if json.Unmarshal(raw, &inner) != nil || inner == nil {
		return errInfo{msg: jsonText(raw)} // {"error": "text"}
	}
	ei := errInfo{typ: jsonText(inner["type"]), code: jsonText(inner["code"]), msg: jsonText(inner["message"])}
	if ei.typ == "" {
		ei.typ = jsonText(inner["status"]) // Google-style "RESOURCE_EXHAUSTED"
	}
	if ei.msg == "" {
		ei.msg = jsonText(inner["detail"])
	}
	ei.quota, ei.retryDelay = googleDetails(inner["details"])
	return ei
}

// Bounds on what googleDetails keeps of a body.
const (
	maxQuotaIDs   = 8
	maxQuotaChars = 500
)

// googleDetails reads a google.rpc error's details array: the quota ids of
// QuotaFailure violations and ErrorInfo metadata (quota_limit), joined with
// ",", and RetryInfo's retryDelay ("46s", "46.114142718s"). Anything it
// cannot read is skipped.
func googleDetails(raw json.RawMessage) (string, time.Duration) {
	var details []json.RawMessage
	if len(bytes.TrimSpace(raw)) == 0 || json.Unmarshal(raw, &details) != nil {
		return "", 0
	}
	var ids []string
	add := func(id string) {
		id = strings.TrimSpace(id)
		if id == "" || len(ids) >= maxQuotaIDs || strings.Contains(id, ",") {
			return
		}
		for _, have := range ids {
			if have == id {
				return
			}
		}
		ids = append(ids, id)
	}
	var delay time.Duration
	for _, d := range details {
		var v struct {
			Type       json.RawMessage              `json:"@type"`
			Violations []map[string]json.RawMessage `json:"violations"`
			Metadata   map[string]json.RawMessage   `json:"metadata"`
			RetryDelay json.RawMessage              `json:"retryDelay"`
		}
		if json.Unmarshal(d, &v) != nil {
			continue
		}
		typ := jsonText(v.Type)
		switch {
		case strings.HasSuffix(typ, "google.rpc.QuotaFailure"):
			for _, viol := range v.Violations {
				add(jsonText(viol["quotaId"]))
			}
		case strings.HasSuffix(typ, "google.rpc.ErrorInfo"):
			add(jsonText(v.Metadata["quota_limit"]))
		case strings.HasSuffix(typ, "google.rpc.RetryInfo"):
			if dd, err := time.ParseDuration(strings.TrimSpace(jsonText(v.RetryDelay))); err == nil && dd > 0 && delay == 0 {
				delay = min(dd, maxHint)
			}
		}
	}
	q := strings.Join(ids, ",")
	if len(q) > maxQuotaChars {
		q = strings.ToValidUTF8(q[:maxQuotaChars], "")
	}
	return q, delay
}

// jsonText returns a JSON string's value or a number's text; "" otherwise.
func jsonText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		var n json.Number
		if json.Unmarshal(raw, &n) == nil {
			return n.String()
		}
	}
	return ""
}

func limitType(ei errInfo, h http.Header, now time.Time) string {
	switch strings.ToLower(ei.typ) {
	case "requests":
		return "requests"
	case "tokens", "input_tokens", "output_tokens":
		return "tokens"
	}
	m := strings.ToLower(ei.msg)
	switch {
	case strings.Contains(m, "(rpm)"), strings.Contains(m, "(rpd)"), strings.Contains(m, "requests per"):
		return "requests"
	case strings.Contains(m, "(tpm)"), strings.Contains(m, "(tpd)"), strings.Contains(m, "tokens per"):
		return "tokens"
	}
	rl := ParseRateLimit(h, now)
	switch {
	case rl.RemainingRequests == 0:
		return "requests"
	case rl.RemainingTokens == 0, strings.TrimSpace(h.Get("Anthropic-Ratelimit-Output-Tokens-Remaining")) == "0":
		return "tokens"
	}
	return ""
}

// keyLike matches API-key-looking tokens. OpenAI echoes a masked key in
// "Incorrect API key provided: sk-ab***yz"; we drop even that.
var keyLike = regexp.MustCompile(`\b(?:sk|pk|rk|key)[-_][A-Za-z0-9_\-*.]{3,}`)

// cleanMessage redacts key-like tokens and truncates to maxMessage runes,
// keeping valid UTF-8.
func cleanMessage(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = keyLike.ReplaceAllString(s, "[redacted]")
	if utf8.RuneCountInString(s) <= maxMessage {
		return s
	}
	n := 0
	for i := range s {
		if n == maxMessage {
			return s[:i] + "…"
		}
		n++
	}
	return s
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// ctxError marks an error that happened because the caller's context ended.
type ctxError struct{ ctx, err error }

func (e *ctxError) Error() string {
	if errors.Is(e.err, e.ctx) {
		return e.err.Error()
	}
	return e.ctx.Error() + ": " + e.err.Error()
}
func (e *ctxError) Unwrap() []error { return []error{e.ctx, e.err} }

// ClassTable renders Rules as a Markdown table, for docs/OPERATIONS.md.
func ClassTable() string {
	var b strings.Builder
	b.WriteString("| When | Status | Type | Code | Message contains | Class | Safe to retry | Note |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	cell := func(s string) string {
		if s == "" {
			return ""
		}
		return "`" + s + "`"
	}
	for _, r := range Rules {
		when, status := "response", ""
		if r.Phase != "" {
			when = "transport: " + string(r.Phase)
		} else {
			switch {
			case r.Status == StatusAny:
				status = "any"
			case r.Status >= Status2xx && r.Status <= Status5xx:
				status = fmt.Sprintf("%dxx", r.Status)
			default:
				status = strconv.Itoa(r.Status)
			}
		}
		safe := ""
		if r.Safe {
			safe = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n",
			when, status, cell(r.Type), cell(r.Code), cell(r.Message), cell(r.Class.String()), safe, strings.ReplaceAll(r.Note, "|", "\\|"))
	}
	return b.String()
}

// OperatorCode reports whether code is one of Rules' money codes (quota,
// billing, spend limits): an answer only the operator can fix.
func OperatorCode(code string) bool {
	for _, r := range Rules {
		if r.Class == OperatorAction && code != "" && (r.Code == code || r.Type == code) {
			return true
		}
	}
	return false
}
