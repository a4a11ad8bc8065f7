package job_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/pkg/job"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const validID = "0190f6b2-7c3a-7d4e-8f00-123456789abc"

// envelope builds a job envelope around a chat-completions body.
func envelope(extra, request string) string {
	if extra != "" {
		extra += ","
	}
	return `{"tenant":"acme",` + extra + `"request":` + request + `}`
}

const minimalRequest = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`

type decodeCase struct {
	name string
	data string
	lim  *job.Limits // nil for job.DefaultLimits
	// wantCode is "" for a job Decode accepts.
	wantCode string
	// wantField is the ValidationError.Field; the message must name it too.
	wantField string
	// wantMsg must appear in the error message.
	wantMsg string
	// wantJob reports whether Decode returns the (partly) decoded job with
	// the error, so ingest can answer the tenant.
	wantJob bool
}

func decodeCases() []decodeCase {
	long := strings.Repeat("k", 257)
	return []decodeCase{
		{name: "minimal", data: envelope("", minimalRequest), wantJob: true},
		{name: "all priorities and fields", data: envelope(`"id":"`+validID+`","priority":"batch","idempotency_key":"op-1","deadline":"2030-01-02T03:04:05Z"`, minimalRequest), wantJob: true},
		{name: "max_completion_tokens", data: envelope("", `{"model":"o3","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":512}`), wantJob: true},
		{name: "max_tokens at the limit", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":128000}`), wantJob: true},
		{name: "n=1", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":1}`), wantJob: true},
		{name: "array content", data: envelope("", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`), wantJob: true},
		{name: "idempotency key of 256 bytes", data: envelope(`"idempotency_key":"`+long[:256]+`"`, minimalRequest), wantJob: true},
		{name: "no body limit", data: envelope("", minimalRequest), lim: &job.Limits{}, wantJob: true},

		{name: "malformed JSON", data: `{"tenant":"acme","request":`, wantCode: job.CodeInvalidRequest, wantMsg: "malformed job JSON"},
		{name: "not an object", data: `[1,2]`, wantCode: job.CodeInvalidRequest, wantMsg: "malformed job JSON"},
		{name: "wrong type for tenant", data: `{"tenant":5,"request":` + minimalRequest + `}`, wantCode: job.CodeInvalidRequest, wantField: "tenant", wantMsg: "tenant: invalid type: expected a string, but got a number"},
		{name: "missing request", data: `{"tenant":"acme"}`, wantCode: job.CodeInvalidRequest, wantField: "request", wantMsg: "is required", wantJob: true},
		{name: "null request", data: `{"tenant":"acme","request":null}`, wantCode: job.CodeInvalidRequest, wantField: "request", wantMsg: "is required", wantJob: true},
		{name: "request not an object", data: envelope("", `"hello"`), wantCode: job.CodeInvalidRequest, wantField: "request", wantMsg: "malformed chat-completions body", wantJob: true},
		{name: "missing model", data: envelope("", `{"messages":[{"role":"user","content":"hi"}]}`), wantCode: job.CodeInvalidRequest, wantField: "request.model", wantMsg: "is required", wantJob: true},
		{name: "empty model", data: envelope("", `{"model":"","messages":[{"role":"user","content":"hi"}]}`), wantCode: job.CodeInvalidRequest, wantField: "request.model", wantMsg: "is required", wantJob: true},
		{name: "no messages", data: envelope("", `{"model":"m"}`), wantCode: job.CodeInvalidRequest, wantField: "request.messages", wantMsg: "at least one message", wantJob: true},
		{name: "empty messages", data: envelope("", `{"model":"m","messages":[]}`), wantCode: job.CodeInvalidRequest, wantField: "request.messages", wantMsg: "at least one message", wantJob: true},
		{name: "message without role", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"a"},{"content":"b"}]}`), wantCode: job.CodeInvalidRequest, wantField: "request.messages[1].role", wantMsg: "is required", wantJob: true},
		{name: "max_tokens 0", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":0}`), wantCode: job.CodeInvalidRequest, wantField: "request.max_tokens", wantMsg: "must be positive, got 0", wantJob: true},
		{name: "max_tokens negative", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":-5}`), wantCode: job.CodeInvalidRequest, wantField: "request.max_tokens", wantMsg: "must be positive, got -5", wantJob: true},
		{name: "max_tokens above limit", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":128001}`), wantCode: job.CodeInvalidRequest, wantField: "request.max_tokens", wantMsg: "is 128001; at most 128000", wantJob: true},
		{name: "max_tokens above a custom limit", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":101}`), lim: &job.Limits{MaxTokens: 100}, wantCode: job.CodeInvalidRequest, wantField: "request.max_tokens", wantMsg: "is 101; at most 100", wantJob: true},
		{name: "max_completion_tokens 0", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0}`), wantCode: job.CodeInvalidRequest, wantField: "request.max_completion_tokens", wantMsg: "must be positive", wantJob: true},
		{name: "max_completion_tokens above limit", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":200000}`), wantCode: job.CodeInvalidRequest, wantField: "request.max_completion_tokens", wantMsg: "at most 128000", wantJob: true},
		{name: "max_tokens not a number", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":"10"}`), wantCode: job.CodeInvalidRequest, wantField: "request.max_tokens", wantMsg: "request.max_tokens: invalid type: expected an integer, but got a string", wantJob: true},
		{name: "role not a string", data: envelope("", `{"model":"m","messages":[{"role":7,"content":"hi"}]}`), wantCode: job.CodeInvalidRequest, wantField: "request.messages.role", wantMsg: "expected a string, but got a number", wantJob: true},
		{name: "max_tokens a fraction", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1.5}`), wantCode: job.CodeInvalidRequest, wantField: "request.max_tokens", wantMsg: "expected an integer, but got the number 1.5", wantJob: true},
		{name: "n=2", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2}`), wantJob: true},
		{name: "n=128", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":128}`), wantJob: true},
		{name: "n=0", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":0}`), wantCode: job.CodeInvalidRequest, wantField: "request.n", wantMsg: "between 1 and 128", wantJob: true},
		{name: "n=129", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":129}`), wantCode: job.CodeInvalidRequest, wantField: "request.n", wantMsg: "between 1 and 128", wantJob: true},
		{name: "embeddings", data: `{"tenant":"acme","endpoint":"embeddings","request":{"model":"e","input":["a","b"]}}`, wantJob: true},
		{name: "embeddings without input", data: `{"tenant":"acme","endpoint":"embeddings","request":{"model":"e"}}`, wantCode: job.CodeInvalidRequest, wantField: "request.input", wantMsg: "is required", wantJob: true},
		{name: "embeddings empty string", data: `{"tenant":"acme","endpoint":"embeddings","request":{"model":"e","input":["a",""]}}`, wantCode: job.CodeInvalidRequest, wantField: "request.input[1]", wantMsg: "must not be empty", wantJob: true},
		{name: "embeddings bad format", data: `{"tenant":"acme","endpoint":"embeddings","request":{"model":"e","input":"a","encoding_format":"hex"}}`, wantCode: job.CodeInvalidRequest, wantField: "request.encoding_format", wantMsg: "float or base64", wantJob: true},
		{name: "unknown endpoint", data: `{"tenant":"acme","endpoint":"images","request":{"model":"e"}}`, wantCode: job.CodeInvalidRequest, wantField: "endpoint", wantMsg: "must be", wantJob: true},
		{name: "stream with n=2", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"n":2}`), wantCode: job.CodeUnsupported, wantField: "request.n", wantMsg: "only n=1", wantJob: true},
		{name: "stream_options without stream", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`), wantCode: job.CodeInvalidRequest, wantField: "request.stream_options", wantMsg: "only allowed with stream=true", wantJob: true},
		{name: "bad id", data: envelope(`"id":"job-42"`, minimalRequest), wantCode: job.CodeInvalidRequest, wantField: "id", wantMsg: `must be a UUID in canonical form`, wantJob: true},
		{name: "long bad id is clipped", data: envelope(`"id":"`+strings.Repeat("x", 100)+`"`, minimalRequest), wantCode: job.CodeInvalidRequest, wantField: "id", wantMsg: strings.Repeat("x", 64) + "…", wantJob: true},
		{name: "unknown field is named", data: envelope(`"priorty":"batch"`, minimalRequest), wantCode: job.CodeInvalidRequest, wantField: "priorty", wantMsg: "is not a field of the job envelope"},
		{name: "data after the envelope", data: envelope(`"priority":"batch"`, minimalRequest) + `{}`, wantCode: job.CodeInvalidRequest, wantMsg: "data after the envelope"},
		{name: "bad priority", data: envelope(`"priority":"urgent"`, minimalRequest), wantCode: job.CodeInvalidRequest, wantField: "priority", wantMsg: `got "urgent"`, wantJob: true},
		{name: "priority is case sensitive", data: envelope(`"priority":"Batch"`, minimalRequest), wantCode: job.CodeInvalidRequest, wantField: "priority", wantMsg: "interactive, standard or batch", wantJob: true},
		{name: "idempotency key too long", data: envelope(`"idempotency_key":"`+long+`"`, minimalRequest), wantCode: job.CodeInvalidRequest, wantField: "idempotency_key", wantMsg: "is 257 bytes; at most 256", wantJob: true},
		{name: "oversize at the default limit", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("a", 1<<20)+`"}]}`), wantCode: job.CodeTooLarge, wantMsg: fmt.Sprintf("; the limit is %d", 1<<20)},
		{name: "oversize", data: envelope("", `{"model":"m","messages":[{"role":"user","content":"`+strings.Repeat("a", 2000)+`"}]}`), lim: &job.Limits{MaxBodyBytes: 1024, MaxTokens: 10}, wantCode: job.CodeTooLarge, wantMsg: "the limit is 1024"},
	}
}

func TestDecode(t *testing.T) {
	t.Parallel()
	for _, tc := range decodeCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lim := job.DefaultLimits
			if tc.lim != nil {
				lim = *tc.lim
			}
			j, err := job.Decode([]byte(tc.data), lim)
			if got, want := j != nil, tc.wantJob; got != want {
				t.Errorf("Decode returned a job: got %v, want %v", got, want)
			}
			if tc.wantCode == "" {
				if err != nil {
					t.Fatalf("Decode: got error %v, want nil", err)
				}
				if !j.Priority.Valid() {
					t.Errorf("priority: got %q, want a valid class", j.Priority)
				}
				return
			}
			if err == nil {
				t.Fatalf("Decode: got nil error, want code %s", tc.wantCode)
			}
			var ve *job.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Decode error: got %T (%v), want *job.ValidationError", err, err)
			}
			if got, want := ve.Code, tc.wantCode; got != want {
				t.Errorf("code: got %q, want %q (%v)", got, want, err)
			}
			if got, want := ve.Field, tc.wantField; got != want {
				t.Errorf("field: got %q, want %q (%v)", got, want, err)
			}
			if tc.wantField != "" && !strings.HasPrefix(err.Error(), tc.wantField+": ") {
				t.Errorf("message: got %q, want it to start with the field %q", err, tc.wantField)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("message: got %q, want it to contain %q", err, tc.wantMsg)
			}
			if msg := err.Error(); strings.Contains(msg, "Go ") || strings.Contains(msg, "ChatRequest") || strings.Contains(msg, "json: ") {
				t.Errorf("message: got %q, which names Go's types or decoder, not the field and JSON type", msg)
			}
		})
	}
}

func TestDecodeDefaultsPriority(t *testing.T) {
	t.Parallel()
	j, err := job.Decode([]byte(envelope("", minimalRequest)), job.DefaultLimits)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if got, want := j.Priority, job.Standard; got != want {
		t.Errorf("priority: got %q, want %q", got, want)
	}
	if got, want := j.Tenant, "acme"; got != want {
		t.Errorf("tenant: got %q, want %q", got, want)
	}
	if got, want := string(j.Request), minimalRequest; got != want {
		t.Errorf("request: got %s, want %s untouched", got, want)
	}
}

func TestDecodeBodyLimitIsInclusive(t *testing.T) {
	t.Parallel()
	data := []byte(envelope("", minimalRequest))
	for _, tc := range []struct {
		max     int
		wantErr bool
	}{{len(data), false}, {len(data) - 1, true}} {
		_, err := job.Decode(data, job.Limits{MaxBodyBytes: tc.max})
		if got, want := err != nil, tc.wantErr; got != want {
			t.Errorf("body of %d bytes, limit %d: got error %v, want error %v", len(data), tc.max, err, want)
		}
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		j        job.Job
		wantErr  string // field; "" for no error
		wantPrio job.Priority
	}{
		{name: "defaults priority", j: job.Job{Request: json.RawMessage(minimalRequest)}, wantPrio: job.Standard},
		{name: "keeps priority", j: job.Job{Priority: job.Interactive, Request: json.RawMessage(minimalRequest)}, wantPrio: job.Interactive},
		{name: "empty request", j: job.Job{Request: json.RawMessage{}}, wantErr: "request"},
		{name: "canonical uuid", j: job.Job{ID: validID, Request: json.RawMessage(minimalRequest)}, wantPrio: job.Standard},
		// Forms uuid.Parse takes that are not valid KV keys or subject
		// tokens: such a job would be redelivered forever.
		{name: "uuid without dashes", j: job.Job{ID: strings.ReplaceAll(validID, "-", ""), Request: json.RawMessage(minimalRequest)}, wantErr: "id"},
		{name: "braced uuid", j: job.Job{ID: "{" + validID + "}", Request: json.RawMessage(minimalRequest)}, wantErr: "id"},
		{name: "urn uuid", j: job.Job{ID: "urn:uuid:" + validID, Request: json.RawMessage(minimalRequest)}, wantErr: "id"},
		{name: "upper-case uuid", j: job.Job{ID: strings.ToUpper(validID), Request: json.RawMessage(minimalRequest)}, wantErr: "id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := tc.j
			err := j.Check(job.DefaultLimits)
			if tc.wantErr != "" {
				var ve *job.ValidationError
				if !errors.As(err, &ve) || ve.Field != tc.wantErr {
					t.Fatalf("Check: got %v, want a validation error on %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check: got %v, want nil", err)
			}
			if got, want := j.Priority, tc.wantPrio; got != want {
				t.Errorf("priority: got %q, want %q", got, want)
			}
		})
	}
}

func TestParseRequest(t *testing.T) {
	t.Parallel()
	body := `{"model":"gpt-4.1","messages":[{"role":"system","content":"be brief"},{"role":"user","name":"ann","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}],"max_tokens":64,"n":1,"tools":[{"type":"function"}],"temperature":0.2}`
	r, err := job.ParseRequest([]byte(body), job.DefaultLimits)
	if err != nil {
		t.Fatalf("ParseRequest: %v", err)
	}
	if got, want := r.Model, "gpt-4.1"; got != want {
		t.Errorf("model: got %q, want %q", got, want)
	}
	if got, want := len(r.Messages), 2; got != want {
		t.Fatalf("messages: got %d, want %d", got, want)
	}
	if got, want := r.Messages[1].Name, "ann"; got != want {
		t.Errorf("name: got %q, want %q", got, want)
	}
	if got, want := r.Messages[1].Text(), "ab"; got != want {
		t.Errorf("text: got %q, want %q", got, want)
	}
	if got, want := r.OutputLimit(1024), 64; got != want {
		t.Errorf("output limit: got %d, want %d", got, want)
	}
	if got, want := string(r.Tools), `[{"type":"function"}]`; got != want {
		t.Errorf("tools: got %s, want %s", got, want)
	}
}

// With both output limits wrong, the error must name the same field every
// time (it used to depend on map iteration order).
func TestParseRequestErrorIsDeterministic(t *testing.T) {
	t.Parallel()
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":-1,"max_completion_tokens":-2}`)
	for i := range 50 {
		_, err := job.ParseRequest(body, job.DefaultLimits)
		var ve *job.ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("run %d: got %v, want a validation error", i, err)
		}
		if got, want := ve.Field, "request.max_tokens"; got != want {
			t.Fatalf("run %d: field got %q, want %q", i, got, want)
		}
	}
}

func TestValidationError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ve   job.ValidationError
		want string
	}{
		{job.ValidationError{Code: job.CodeInvalidRequest, Field: "request.model", Message: "is required"}, "request.model: is required"},
		{job.ValidationError{Code: job.CodeTooLarge, Message: "too big"}, "too big"},
	} {
		if got := tc.ve.Error(); got != tc.want {
			t.Errorf("Error(): got %q, want %q", got, tc.want)
		}
		e := tc.ve.AsError()
		if got, want := e.Code, tc.ve.Code; got != want {
			t.Errorf("AsError code: got %q, want %q", got, want)
		}
		if got, want := e.Message, tc.want; got != want {
			t.Errorf("AsError message: got %q, want %q", got, want)
		}
		if got, want := e.Error(), tc.ve.Code+": "+tc.want; got != want {
			t.Errorf("Error.Error(): got %q, want %q", got, want)
		}
	}
}

func TestChatMessageText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		content string
		want    string
	}{
		{"string", `"hello world"`, "hello world"},
		{"escaped string", `"line\nbreak \u00e9"`, "line\nbreak é"},
		{"empty string", `""`, ""},
		{"absent", ``, ""},
		{"null", `null`, ""},
		{"text parts", `[{"type":"text","text":"hello "},{"type":"text","text":"world"}]`, "hello world"},
		{"image parts are skipped", `[{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"text","text":"caption"}]`, "caption"},
		{"empty array", `[]`, ""},
		{"other JSON falls back to raw", `{"a":1}`, `{"a":1}`},
		{"number falls back to raw", `42`, `42`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := job.ChatMessage{Role: "user", Content: json.RawMessage(tc.content)}
			if got := m.Text(); got != tc.want {
				t.Errorf("Text(): got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestOutputLimit(t *testing.T) {
	t.Parallel()
	p := func(n int) *int { return &n }
	for _, tc := range []struct {
		name string
		r    job.ChatRequest
		want int
	}{
		{"neither", job.ChatRequest{}, 1024},
		{"max_tokens", job.ChatRequest{MaxTokens: p(10)}, 10},
		{"max_completion_tokens", job.ChatRequest{MaxCompletionTokens: p(20)}, 20},
		{"both: max_completion_tokens wins", job.ChatRequest{MaxTokens: p(10), MaxCompletionTokens: p(20)}, 20},
	} {
		if got := tc.r.OutputLimit(1024); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestEstimateCost(t *testing.T) {
	t.Parallel()
	if got, want := (job.Estimate{PromptTokens: 120, MaxTokens: 800}).Cost(), 920; got != want {
		t.Errorf("Cost: got %d, want %d", got, want)
	}
}

func TestPriorityAndStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p    job.Priority
		want bool
	}{{job.Interactive, true}, {job.Standard, true}, {job.Batch, true}, {"", false}, {"urgent", false}, {"BATCH", false}} {
		if got := tc.p.Valid(); got != tc.want {
			t.Errorf("Priority(%q).Valid(): got %v, want %v", tc.p, got, tc.want)
		}
	}
	if got, want := fmt.Sprint(job.Priorities), "[interactive standard batch]"; got != want {
		t.Errorf("Priorities: got %s, want %s (highest first)", got, want)
	}
	for _, tc := range []struct {
		s    job.Status
		want bool
	}{{job.StatusQueued, false}, {job.StatusSucceeded, true}, {job.StatusFailed, true}, {job.StatusExpired, true}, {job.StatusDeadLettered, true}, {"running", false}} {
		if got := tc.s.Terminal(); got != tc.want {
			t.Errorf("Status(%q).Terminal(): got %v, want %v", tc.s, got, tc.want)
		}
	}
}

// FuzzDecode checks that Decode never panics and that any job it accepts is a
// fixed point: encoding it and decoding again is accepted and encodes the same.
func FuzzDecode(f *testing.F) {
	for _, tc := range decodeCases() {
		f.Add([]byte(tc.data))
	}
	f.Add([]byte(`{"tenant":"a","REQUEST":` + minimalRequest + `,"request":` + minimalRequest + `}`))
	f.Add([]byte(`{"tenant":"a\xff","deadline":"2030-01-02T03:04:05+05:30","request":{"model":"m\u2028<>&","messages":[{"role":"r","content":null}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := job.Decode(data, job.DefaultLimits)
		if err != nil {
			var ve *job.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Decode error: got %T (%v), want *job.ValidationError", err, err)
			}
			if ve.Code == "" {
				t.Fatalf("Decode error %v has no code", err)
			}
			return
		}
		if j == nil {
			t.Fatal("Decode: got nil job and nil error")
		}
		if !j.Priority.Valid() {
			t.Fatalf("accepted job has priority %q", j.Priority)
		}
		if j.Endpoint == job.EndpointEmbeddings {
			r1, err := job.ParseEmbeddings(j.Request)
			if err != nil {
				t.Fatalf("accepted job's request fails ParseEmbeddings: %v", err)
			}
			enc, _ := json.Marshal(j)
			j2, err := job.Decode(enc, job.DefaultLimits)
			if err != nil {
				t.Fatalf("decode of re-encoded job: got %v, want nil", err)
			}
			r2, err := job.ParseEmbeddings(j2.Request)
			if err != nil || r2.Model != r1.Model || r2.Inputs() != r1.Inputs() {
				t.Fatalf("embeddings after round trip: got %+v (%v), want %+v", r2, err, r1)
			}
			return
		}
		if _, err := job.ParseRequest(j.Request, job.DefaultLimits); err != nil {
			t.Fatalf("accepted job's request fails ParseRequest: %v", err)
		}
		enc, err := json.Marshal(j)
		if err != nil {
			t.Fatalf("re-encode accepted job: %v", err)
		}
		j2, err := job.Decode(enc, job.Limits{MaxTokens: job.DefaultLimits.MaxTokens})
		if err != nil {
			t.Fatalf("decode of re-encoded job: got %v, want nil\noriginal: %q\nre-encoded: %s", err, data, enc)
		}
		enc2, err := json.Marshal(j2)
		if err != nil {
			t.Fatalf("re-encode second job: %v", err)
		}
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("re-encoding not stable:\n got %s\nwant %s", enc2, enc)
		}
		r1, err1 := job.ParseRequest(j.Request, job.DefaultLimits)
		r2, err2 := job.ParseRequest(j2.Request, job.DefaultLimits)
		if err1 != nil || err2 != nil {
			t.Fatalf("ParseRequest: got %v and %v, want nil", err1, err2)
		}
		if got, want := r2.Model, r1.Model; got != want {
			t.Fatalf("model after round trip: got %q, want %q", got, want)
		}
		if got, want := len(r2.Messages), len(r1.Messages); got != want {
			t.Fatalf("messages after round trip: got %d, want %d", got, want)
		}
		if got, want := r2.OutputLimit(-1), r1.OutputLimit(-1); got != want {
			t.Fatalf("output limit after round trip: got %d, want %d", got, want)
		}
	})
}

func TestDecodeCost(t *testing.T) {
	t.Parallel()
	const req = `"request":{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name, cost string
		want       map[string]int
		field      string // of the error; "" for none
	}{
		{"images", `{"images": 2}`, map[string]int{"images": 2}, ""},
		{"zero is a cost", `{"images": 0, "audio_seconds": 30}`, map[string]int{"images": 0, "audio_seconds": 30}, ""},
		{"negative", `{"images": -1}`, nil, "cost.images"},
		{"too large", `{"images": 2000000000}`, nil, "cost.images"},
		{"upper case name", `{"Images": 1}`, nil, "cost"},
		{"a built-in dimension", `{"tokens": 1}`, nil, "cost"},
		{"too many", `{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}`, nil, "cost"},
		{"not a number", `{"images": "two"}`, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j, err := job.Decode([]byte(`{"tenant":"t",`+req+`,"cost":`+tc.cost+`}`), job.DefaultLimits)
			if tc.want != nil {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if fmt.Sprint(j.Cost) != fmt.Sprint(tc.want) {
					t.Errorf("cost: got %v, want %v", j.Cost, tc.want)
				}
				return
			}
			var ve *job.ValidationError
			if !errors.As(err, &ve) || ve.Code != job.CodeInvalidRequest {
				t.Fatalf("Decode: got %v, want an invalid_request", err)
			}
			if tc.field != "" && ve.Field != tc.field {
				t.Errorf("field: got %q, want %q (%v)", ve.Field, tc.field, err)
			}
		})
	}
}

// What a producer writes in the members Sluice sets is not believed: a
// forged spend hold would let a job pass its tenant's spend budget free.
// The envelope has no such fields; Parse reads and drops them (a job read
// from a subject may be published again), and keeps the producer's pin.
func TestEnvelopeDropsWhatSluiceSets(t *testing.T) {
	t.Parallel()
	forged := `{"tenant":"acme","request":{"model":"m","messages":[{"role":"user","content":"hi"}]},"provider":"p","model":"m","gated":true,"pinned":true,
		"reservation":{"id":"1-0"},"spend_hold":{"amount":1000000000,"day":"20261203"},"requeued":{"reason":"x","n":1},"seal":"s","revs":{"record":1}}`
	j, err := job.Parse([]byte(forged), job.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(out, &members); err != nil {
		t.Fatal(err)
	}
	for _, m := range job.SluiceMembers {
		if _, ok := members[m]; ok {
			t.Errorf("envelope re-encoded carries %q: %s", m, out)
		}
	}
	if j.Provider != "p" {
		t.Errorf("provider = %q, want the producer's pin kept", j.Provider)
	}
	if _, err := job.Parse([]byte(`{"tenant":"acme","request":{},"GATED":true}`), job.Limits{}); err == nil {
		t.Error("a case variant of a member Sluice sets was accepted")
	}
}
