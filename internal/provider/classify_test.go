package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// oaiErr builds an OpenAI error body; empty code becomes null.
func oaiErr(typ, code, msg string) string {
	c := "null"
	if code != "" {
		c = fmt.Sprintf("%q", code)
	}
	t := "null"
	if typ != "" {
		t = fmt.Sprintf("%q", typ)
	}
	return fmt.Sprintf(`{"error":{"message":%q,"type":%s,"param":null,"code":%s}}`, msg, t, c)
}

// antErr builds an Anthropic error body.
func antErr(typ, msg string) string {
	return fmt.Sprintf(`{"type":"error","error":{"type":%q,"message":%q},"request_id":"req_1"}`, typ, msg)
}

type classCase struct {
	name      string
	status    int
	body      string
	header    http.Header
	class     Class
	code      string
	safe      bool
	limit     string
	retry     time.Duration
	unknown   bool
	msgSubstr string
}

var classCases = []classCase{
	{name: "200 success", status: 200, body: `{"id":"x","choices":[]}`, class: Success, safe: false},
	{name: "204 success", status: 204, class: Success},

	// Money.
	{name: "openai insufficient_quota", status: 429, body: oaiErr("insufficient_quota", "insufficient_quota", "You exceeded your current quota, please check your plan and billing details."), class: OperatorAction, code: "insufficient_quota", msgSubstr: "exceeded your current quota"},
	{name: "openai insufficient_quota in type only", status: 429, body: oaiErr("insufficient_quota", "", "quota"), class: OperatorAction, code: "insufficient_quota"},
	{name: "billing_hard_limit_reached", status: 429, body: oaiErr("", "billing_hard_limit_reached", "hard limit"), class: OperatorAction, code: "billing_hard_limit_reached"},
	{name: "billing_not_active", status: 429, body: oaiErr("billing_not_active", "billing_not_active", "inactive"), class: OperatorAction, code: "billing_not_active"},
	{name: "usage_limit_exceeded", status: 429, body: oaiErr("", "usage_limit_exceeded", "usage"), class: OperatorAction, code: "usage_limit_exceeded"},
	{name: "spend_limit_exceeded", status: 403, body: oaiErr("", "spend_limit_exceeded", "spend"), class: OperatorAction, code: "spend_limit_exceeded"},
	{name: "budget_exceeded", status: 400, body: oaiErr("budget_exceeded", "", "Budget has been exceeded"), class: OperatorAction, code: "budget_exceeded"},
	{name: "anthropic billing_error", status: 402, body: antErr("billing_error", "billing issue"), class: OperatorAction, code: "billing_error"},
	{name: "anthropic credit balance low", status: 400, body: antErr("invalid_request_error", "Your credit balance is too low to access the Anthropic API."), class: OperatorAction, code: "invalid_request_error"},
	{name: "402 plain", status: 402, body: `Payment Required`, class: OperatorAction, code: "http_402"},

	// Throttling.
	{name: "openai rpm", status: 429, body: oaiErr("requests", "rate_limit_exceeded", "Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 3, Used 3, Requested 1."),
		header: http.Header{"Retry-After-Ms": {"1500"}, "Retry-After": {"2"}}, class: Retry, code: "rate_limit_exceeded", safe: true, limit: "requests", retry: 1500 * time.Millisecond},
	{name: "openai tpm by message", status: 429, body: oaiErr("", "rate_limit_exceeded", "Rate limit reached on tokens per min (TPM): Limit 30000"),
		header: http.Header{"Retry-After": {"3"}}, class: Retry, code: "rate_limit_exceeded", safe: true, limit: "tokens", retry: 3 * time.Second},
	{name: "openai tokens type", status: 429, body: oaiErr("tokens", "rate_limit_exceeded", "slow"), class: Retry, code: "rate_limit_exceeded", safe: true, limit: "tokens"},
	{name: "anthropic rate_limit_error", status: 429, body: antErr("rate_limit_error", "This request would exceed the rate limit for your organization of 50,000 input tokens per minute."),
		header: http.Header{"Retry-After": {"7"}}, class: Retry, code: "rate_limit_error", safe: true, limit: "tokens", retry: 7 * time.Second},
	{name: "anthropic rate limit by header", status: 429, body: antErr("rate_limit_error", "Number of request tokens has exceeded your limit."),
		header: http.Header{"Anthropic-Ratelimit-Requests-Remaining": {"0"}}, class: Retry, code: "rate_limit_error", safe: true, limit: "requests"},
	{name: "anthropic output tokens header", status: 429, body: antErr("rate_limit_error", "limit"),
		header: http.Header{"Anthropic-Ratelimit-Output-Tokens-Remaining": {"0"}}, class: Retry, code: "rate_limit_error", safe: true, limit: "tokens"},
	{name: "slow_down on 503", status: 503, body: oaiErr("", "slow_down", "Please reduce your rate of requests."), class: Retry, code: "slow_down", safe: true},
	{name: "429 unrecognized", status: 429, body: `{"message":"too many"}`, header: http.Header{"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Remaining-Requests": {"12"}}, class: Retry, code: "http_429", safe: true, limit: "tokens"},
	{name: "429 empty body", status: 429, class: Retry, code: "http_429", safe: true},
	{name: "409 idempotency", status: 409, body: oaiErr("idempotency_error", "", "in progress"), class: Retry, code: "idempotency_error", safe: true},

	// Overload.
	{name: "anthropic overloaded 529", status: 529, body: antErr("overloaded_error", "Overloaded"), class: Overloaded, code: "overloaded_error", safe: true},
	{name: "529 plain", status: 529, class: Overloaded, code: "http_529", safe: true},
	{name: "openai server_is_overloaded", status: 503, body: oaiErr("server_error", "server_is_overloaded", "overloaded"), class: Overloaded, code: "server_is_overloaded", safe: true},
	{name: "503 plain with retry-after", status: 503, body: `<html>unavailable</html>`, header: http.Header{"Retry-After": {"4"}}, class: Overloaded, code: "http_503", safe: true, retry: 4 * time.Second},
	{name: "408", status: 408, class: Overloaded, code: "http_408", safe: true},
	{name: "anthropic api_error 500", status: 500, body: antErr("api_error", "Internal server error"), class: Overloaded, code: "api_error"},
	{name: "500 x-should-retry", status: 500, body: oaiErr("server_error", "", "oops"), header: http.Header{"X-Should-Retry": {"true"}}, class: Overloaded, code: "server_error", safe: true},
	{name: "502", status: 502, body: `bad gateway`, class: Overloaded, code: "http_502"},
	{name: "504 anthropic timeout", status: 504, body: antErr("timeout_error", "timeout"), class: Overloaded, code: "timeout_error"},
	{name: "599", status: 599, class: Overloaded, code: "http_599"},

	// Credentials.
	{name: "openai invalid_api_key", status: 401, body: oaiErr("invalid_request_error", "invalid_api_key", "Incorrect API key provided: sk-proj-ab***********************yz12. You can find your API key at the dashboard."), class: AuthBroken, code: "invalid_api_key", msgSubstr: "provided: [redacted]"},
	{name: "anthropic authentication_error", status: 401, body: antErr("authentication_error", "invalid x-api-key"), class: AuthBroken, code: "authentication_error"},
	{name: "401 plain", status: 401, class: AuthBroken, code: "http_401"},
	{name: "anthropic permission_error", status: 403, body: antErr("permission_error", "no access"), class: AuthBroken, code: "permission_error"},
	{name: "403 plain", status: 403, body: oaiErr("", "unsupported_country_region_territory", "Country not supported"), class: AuthBroken, code: "unsupported_country_region_territory"},

	// Invalid.
	{name: "context_length_exceeded", status: 400, body: oaiErr("invalid_request_error", "context_length_exceeded", "This model's maximum context length is 128000 tokens."), class: Fail, code: "context_length_exceeded"},
	{name: "content_policy_violation", status: 400, body: oaiErr("invalid_request_error", "content_policy_violation", "rejected"), class: Fail, code: "content_policy_violation"},
	{name: "content_filter", status: 400, body: oaiErr("", "content_filter", "filtered"), class: Fail, code: "content_filter"},
	{name: "anthropic invalid_request_error", status: 400, body: antErr("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"), class: Fail, code: "invalid_request_error"},
	{name: "400 plain", status: 400, body: `{"detail":"bad"}`, class: Fail, code: "http_400", msgSubstr: "bad"},
	{name: "anthropic not_found_error", status: 404, body: antErr("not_found_error", "model: claude-nope"), class: Fail, code: "not_found_error"},
	{name: "anthropic request_too_large", status: 413, body: antErr("request_too_large", "Request exceeds the maximum allowed number of bytes."), class: Fail, code: "request_too_large"},
	{name: "422", status: 422, body: `{"detail":[{"loc":["body"],"msg":"field required"}]}`, class: Fail, code: "http_422"},
	{name: "418 other 4xx", status: 418, body: `{"error":"teapot"}`, class: Fail, code: "http_418", msgSubstr: "teapot"},
	{name: "307 redirect", status: 307, class: Fail, code: "http_307"},
	{name: "101 unknown", status: 101, class: Unknown, code: "http_101", unknown: true},
	{name: "600 unknown", status: 600, class: Unknown, code: "http_600", unknown: true},

	// Body variants.
	{name: "google-style array", status: 429, body: `[{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED"}}]`, class: Retry, code: "429", safe: true},
	{name: "x-should-retry false", status: 429, body: oaiErr("requests", "rate_limit_exceeded", "x"), header: http.Header{"X-Should-Retry": {"false"}}, class: Retry, code: "rate_limit_exceeded", safe: false, limit: "requests"},
}

func TestClassifyTable(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range classCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := tc.header
			if h == nil {
				h = http.Header{}
			}
			o := Classify(&Response{Status: tc.status, Header: h, Body: []byte(tc.body)}, nil, now)
			if o.Class != tc.class {
				t.Errorf("class = %v, want %v", o.Class, tc.class)
			}
			if o.Code != tc.code && tc.class != Success {
				t.Errorf("code = %q, want %q", o.Code, tc.code)
			}
			if o.SafeToRetry != tc.safe {
				t.Errorf("safe = %v, want %v", o.SafeToRetry, tc.safe)
			}
			if o.LimitType != tc.limit {
				t.Errorf("limit = %q, want %q", o.LimitType, tc.limit)
			}
			if o.RetryAfter != tc.retry {
				t.Errorf("retry after = %v, want %v", o.RetryAfter, tc.retry)
			}
			if o.OutcomeUnknown != tc.unknown || o.WorkDone {
				t.Errorf("unknown=%v workDone=%v", o.OutcomeUnknown, o.WorkDone)
			}
			if o.HTTPStatus != tc.status {
				t.Errorf("status = %d", o.HTTPStatus)
			}
			if tc.msgSubstr != "" && !strings.Contains(o.Message, tc.msgSubstr) {
				t.Errorf("message %q lacks %q", o.Message, tc.msgSubstr)
			}
			if strings.Contains(o.Message, "sk-proj") {
				t.Errorf("message leaks a key: %q", o.Message)
			}
		})
	}
}

// Every HTTP row of Rules must be exercised by some case above.
func TestClassCasesCoverEveryRule(t *testing.T) {
	t.Parallel()
	hit := map[int]bool{}
	for _, tc := range classCases {
		ei := errInfo{}
		if tc.status < 200 || tc.status > 299 {
			ei = parseErrorBody([]byte(tc.body))
		}
		_, i := matchHTTP(tc.status, ei)
		hit[i] = true
	}
	for i, r := range Rules {
		if r.Phase == "" && !hit[i] {
			t.Errorf("rule %d (%+v) has no test case", i, r)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

func TestClassifyTransport(t *testing.T) {
	t.Parallel()
	now := time.Now()
	cases := []struct {
		name          string
		err           error
		class         Class
		code          string
		safe, unk, wd bool
		isCanceled    bool
		isDeadline    bool
	}{
		{"build", &TransportError{Phase: PhaseBuild, Err: errors.New("invalid base URL")}, Fail, "invalid_request", true, false, false, false, false},
		{"connect refused", &TransportError{Phase: PhaseConnect, Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}, ConnectFailed, "connect_refused", true, false, false, false, false},
		{"connect timeout", &TransportError{Phase: PhaseConnect, Err: &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}}, ConnectFailed, "connect_timeout", true, false, false, false, false},
		{"connect other", &TransportError{Phase: PhaseConnect, Err: errors.New("tls: handshake failure")}, ConnectFailed, "connect_failed", true, false, false, false, false},
		{"header timeout", &TransportError{Phase: PhaseAwaitHeaders, Err: timeoutErr{}}, Unknown, "header_timeout", false, true, false, false, false},
		{"reset", &TransportError{Phase: PhaseAwaitHeaders, Err: io.EOF}, Unknown, "connection_reset", false, true, false, false, false},
		{"stream cut", &TransportError{Phase: PhaseBody, Err: io.ErrUnexpectedEOF}, Unknown, "stream_cut", false, false, true, false, false},
		{"too large", &TransportError{Phase: PhaseBody, Err: ErrBodyTooLarge}, Unknown, "body_too_large", false, false, true, false, false},
		{"canceled awaiting", &TransportError{Phase: PhaseAwaitHeaders, Err: &ctxError{ctx: context.Canceled, err: context.Canceled}}, Unknown, "canceled", false, true, false, true, false},
		{"deadline connecting", &TransportError{Phase: PhaseConnect, Err: &ctxError{ctx: context.DeadlineExceeded, err: timeoutErr{}}}, ConnectFailed, "deadline_exceeded", true, false, false, false, true},
		{"foreign error", errors.New("weird"), Unknown, "connection_reset", false, true, false, false, false},
		{"bad phase", &TransportError{Phase: "nope", Err: errors.New("x")}, Unknown, "connection_reset", false, true, false, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := Classify(nil, tc.err, now)
			if o.Class != tc.class || o.Code != tc.code || o.SafeToRetry != tc.safe || o.OutcomeUnknown != tc.unk || o.WorkDone != tc.wd {
				t.Errorf("got %+v", o)
			}
			if errors.Is(tc.err, context.Canceled) != tc.isCanceled || errors.Is(tc.err, context.DeadlineExceeded) != tc.isDeadline {
				t.Errorf("errors.Is mismatch for %v", tc.err)
			}
		})
	}
	if o := Classify(nil, nil, now); o.Class != Unknown || !o.OutcomeUnknown {
		t.Errorf("nil response: %+v", o)
	}
}

func TestClassNamesStable(t *testing.T) {
	t.Parallel()
	want := map[Class]string{
		Unknown: "unknown", Success: "success", Retry: "rate_limited", Overloaded: "overloaded",
		OperatorAction: "operator_action", Fail: "invalid", AuthBroken: "auth", ConnectFailed: "connect",
	}
	if len(Classes) != len(want) {
		t.Fatalf("Classes has %d entries, want %d", len(Classes), len(want))
	}
	for _, c := range Classes {
		if c.String() != want[c] {
			t.Errorf("%d.String() = %q, want %q", int(c), c.String(), want[c])
		}
	}
	var zero Outcome
	if zero.Class != Unknown {
		t.Error("the zero Outcome must be Unknown")
	}
}

func TestClassTable(t *testing.T) {
	t.Parallel()
	md := ClassTable()
	lines := strings.Split(strings.TrimSpace(md), "\n")
	if len(lines) != len(Rules)+2 {
		t.Fatalf("table has %d lines, want %d", len(lines), len(Rules)+2)
	}
	for _, want := range []string{"| response | 429 |", "`rate_limit_error`", "| transport: connect |", "`operator_action`", "| 5xx |", "| any |"} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	for i, l := range lines {
		if strings.Count(l, "|") != 9 {
			t.Errorf("line %d has %d pipes: %s", i, strings.Count(l, "|"), l)
		}
	}
}

func TestMessageTruncatedAndRedacted(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 800)
	o := Classify(&Response{Status: 400, Body: []byte(oaiErr("invalid_request_error", "", long))}, nil, time.Now())
	if n := len([]rune(o.Message)); n != maxMessage+1 { // + ellipsis
		t.Errorf("message has %d runes", n)
	}
	o = Classify(&Response{Status: 401, Body: []byte(antErr("authentication_error", "bad key sk-ant-api03-abcdefgh"))}, nil, time.Now())
	if strings.Contains(o.Message, "abcdefgh") {
		t.Errorf("key not redacted: %q", o.Message)
	}
}

func TestJobError(t *testing.T) {
	t.Parallel()
	if (Outcome{Class: Success}).JobError() != nil {
		t.Error("success has no job error")
	}
	e := Outcome{Class: Retry, Code: "rate_limit_exceeded", Message: "slow", RetryAfter: 1500 * time.Millisecond}.JobError()
	if e.Code != "rate_limit_exceeded" || e.Message != "slow" || e.RetryAfterMS != 1500 {
		t.Errorf("%+v", e)
	}
	e = Outcome{Class: Overloaded}.JobError()
	if e.Code != "provider_error" || e.Message != "overloaded" {
		t.Errorf("%+v", e)
	}
	if _, err := json.Marshal(e); err != nil {
		t.Fatal(err)
	}
}
