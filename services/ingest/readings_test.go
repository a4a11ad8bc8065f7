package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// errorMessage is the message of an error answer, in OpenAI's shape or
// Anthropic's.
func errorMessage(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	return e.Error.Message
}

// queueEmpty fails the test when QUEUE holds a job: one there would reach
// admission and a provider.
func (f *fixture) queueEmpty(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	st, err := f.js.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Errorf("QUEUE after refused bodies: %d jobs (%v), want none: no provider call may be made for them", info.State.Msgs, err)
	}
}

// big is a prompt of about 20,000 tokens.
var big = strings.Repeat("word ", 20000)

const hiMessages = `"messages":[{"role":"user","content":"hi"}]`

// A body Sluice would read one way and a provider another (Go's
// encoding/json takes member names case-insensitively and the last of two
// alike; the body is forwarded as it came) is refused with a 400 naming
// the member, on every endpoint, and nothing reaches QUEUE.
func TestBodiesReadTwoWaysRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mux := f.mux()
	for _, c := range []struct{ name, path, body, param, want string }{
		{"max_tokens budgeted as 1, run as 100000", "/v1/chat/completions", `{"model":"fast",` + hiMessages + `,"max_tokens":100000,"MAX_TOKENS":1}`,
			"request", `duplicate member "max_tokens" (also as "MAX_TOKENS")`},
		{"n budgeted as 1, run as 100", "/v1/chat/completions", `{"model":"fast","max_tokens":16,` + hiMessages + `,"n":100,"N":1}`,
			"request", `duplicate member "n" (also as "N")`},
		{"a big prompt estimated as a tiny one", "/v1/chat/completions", `{"model":"fast","max_tokens":16,"messages":[{"role":"user","content":"` + big + `"}],"MESSAGES":[{"role":"user","content":"hi"}]}`,
			"request", `duplicate member "messages" (also as "MESSAGES")`},
		{"charged to one model, run on another", "/v1/chat/completions", `{"model":"fast","MODEL":"slow","max_tokens":16,` + hiMessages + `}`,
			"request", `duplicate member "model" (also as "MODEL")`},
		{"the same name twice", "/v1/chat/completions", `{"model":"fast","max_tokens":100000,"max_tokens":1,` + hiMessages + `}`,
			"request", `duplicate member "max_tokens" (also as "max_tokens")`},
		{"a name read only by folding", "/v1/chat/completions", `{"model":"fast","MAX_TOKENS":1,` + hiMessages + `}`,
			"request", `member "MAX_TOKENS" is read as "max_tokens"`},
		{"a nested case variant", "/v1/chat/completions", `{"model":"fast","max_tokens":16,"messages":[{"role":"user","content":"` + big + `","CONTENT":"hi"}]}`,
			"messages[0]", `duplicate member "content" (also as "CONTENT")`},
		{"messages: a content block", "/v1/messages", `{"model":"fast","max_tokens":16,"messages":[{"role":"user","content":[{"type":"text","text":"` + big + `","TEXT":"hi"}]}]}`,
			"", `duplicate member "text" (also as "TEXT")`},
		{"responses: the output bound twice", "/v1/responses", `{"model":"fast","input":"hi","max_output_tokens":100000,"max_output_tokens":1}`,
			"", `duplicate member "max_output_tokens"`},
		{"responses: an input item", "/v1/responses", `{"model":"fast","input":[{"role":"user","content":"` + big + `","CONTENT":"hi"}]}`,
			"", `duplicate member "content" (also as "CONTENT")`},
		{"embeddings: the input", "/v1/embeddings", `{"model":"fast","input":"` + big + `","INPUT":"hi"}`,
			"request", `duplicate member "input" (also as "INPUT")`},
		{"jobs: the request", "/v1/jobs", `{"request":{"model":"fast",` + hiMessages + `,"max_tokens":100000,"MAX_TOKENS":1}}`,
			"request", `duplicate member "max_tokens" (also as "MAX_TOKENS")`},
		{"jobs: the envelope", "/v1/jobs", `{"priority":"batch","PRIORITY":"interactive","request":` + chatHi + `}`,
			"", `duplicate member "priority" (also as "PRIORITY")`},
		{"jobs: the endpoint", "/v1/jobs", `{"endpoint":"embeddings","Endpoint":"chat.completions","request":` + chatHi + `}`,
			"", `duplicate member "endpoint" (also as "Endpoint")`},
	} {
		rec := post(mux, c.path, "acme", c.body, map[string]string{"X-Sluice-Wait-Timeout": "0.2"})
		msg := errorMessage(t, rec.Body.Bytes())
		if rec.Code != http.StatusBadRequest || !strings.Contains(msg, c.want) {
			t.Errorf("%s: POST %s: got %d %.300s, want 400 saying %s", c.name, c.path, rec.Code, rec.Body, c.want)
			continue
		}
		var e struct {
			Error struct {
				Param *string `json:"param"`
			} `json:"error"`
		}
		_ = json.Unmarshal(rec.Body.Bytes(), &e)
		if c.path != "/v1/jobs" {
			// The provider APIs have no "request": the whole body at
			// fault has param null (issue 37: no envelope paths there).
			if e.Error.Param != nil && *e.Error.Param == "request" || strings.Contains(msg, "request.") || strings.HasPrefix(msg, "request:") {
				t.Errorf("%s: POST %s: param %v, message %q; want no envelope path", c.name, c.path, e.Error.Param, msg)
			}
			continue
		}
		if c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param) {
			t.Errorf("%s: POST %s: param %v, want %q", c.name, c.path, e.Error.Param, c.param)
		}
	}
	f.queueEmpty(t)
}

// The Responses API's native member (the input, tools and include sent
// as they are to a provider serving the Responses API) is set only by the
// /v1/responses handler, after its size and tool checks: a producer's
// body naming it is refused on every path (jobs API, NATS, chat
// completions), and nothing reaches QUEUE.
func TestNativeMemberRefusedFromProducers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mux := f.mux()
	native := `{"input":[{"type":"input_file","file_data":"` + big + `"}],"tools":[{"type":"web_search"},{"type":"mcp","server_url":"https://x"}]}`
	smuggled := `{"model":"fast","max_tokens":16,` + hiMessages + `,"sluice_responses":` + native + `}`
	for _, c := range []struct{ path, body, param string }{
		{"/v1/jobs", `{"endpoint":"responses","request":` + smuggled + `}`, "sluice_responses"},
		{"/v1/jobs", `{"endpoint":"responses","request":` + strings.Replace(smuggled, "sluice_responses", "SLUICE_RESPONSES", 1) + `}`, "SLUICE_RESPONSES"},
		{"/v1/jobs", `{"request":` + smuggled + `}`, "sluice_responses"},
		{"/v1/chat/completions", smuggled, "sluice_responses"},
	} {
		rec := post(mux, c.path, "acme", c.body, map[string]string{"X-Sluice-Wait-Timeout": "0.2"})
		if msg := errorMessage(t, rec.Body.Bytes()); rec.Code != http.StatusBadRequest || !strings.Contains(msg, c.param) || !strings.Contains(msg, "set by Sluice only") {
			t.Errorf("POST %s with %s: got %d %.300s, want 400 naming %s as Sluice's own", c.path, c.param, rec.Code, rec.Body, c.param)
		}
	}
	f.queueEmpty(t)
}

// Over NATS the same bodies end in a failed result naming the member, and
// nothing reaches QUEUE.
func TestIntakeBodiesReadTwoWaysRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.run(t)
	sub, err := f.nc.SubscribeSync(job.ResultPrefix + "acme.>")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	smuggled := `{"model":"fast","max_tokens":16,` + hiMessages + `,"sluice_responses":{"input":[],"tools":[{"type":"web_search"}]}}`
	cases := map[string]string{}
	for body, want := range map[string]string{
		`"request":{"model":"fast",` + hiMessages + `,"max_tokens":100000,"MAX_TOKENS":1}`: `duplicate member "max_tokens" (also as "MAX_TOKENS")`,
		`"request":{"model":"fast","MODEL":"slow","max_tokens":16,` + hiMessages + `}`:     `duplicate member "model" (also as "MODEL")`,
		`"endpoint":"responses","ENDPOINT":"chat.completions","request":` + chatHi:         `duplicate member "endpoint" (also as "ENDPOINT")`,
		`"endpoint":"responses","request":` + smuggled:                                     `request.sluice_responses: is set by Sluice only`,
		`"Request":` + chatHi: `member "Request" is read as "request"`,
	} {
		id := job.NewID()
		cases[id] = want
		if _, err := f.js.Publish(context.Background(), job.IntakeSubject("acme"), []byte(`{"id":"`+id+`",`+body+`}`)); err != nil {
			t.Fatal(err)
		}
	}
	for range cases {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("waiting for the refusals: %v", err)
		}
		var res job.Result
		if err := json.Unmarshal(m.Data, &res); err != nil {
			t.Fatal(err)
		}
		want, ok := cases[res.JobID]
		if !ok {
			t.Fatalf("result for job %s, which was not sent", res.JobID)
		}
		if res.Status != job.StatusFailed || res.Error == nil || res.Error.Code != job.CodeInvalidRequest || !strings.Contains(res.Error.Message, want) {
			t.Errorf("job %s: %s %+v, want failed invalid_request saying %s", res.JobID, res.Status, res.Error, want)
		}
	}
	f.queueEmpty(t)
}

// store and metadata have the provider keep the completion in the
// operator's account: refused by default (store false passes), let
// through by the model's allow_fields.
func TestStoreAndMetadataRefusedByDefault(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mux := f.mux()
	for _, field := range []string{`"store":true`, `"metadata":{"k":"v"}`} {
		rec := post(mux, "/v1/chat/completions", "acme", `{"model":"fast","max_tokens":16,`+hiMessages+`,`+field+`}`,
			map[string]string{"X-Sluice-Wait-Timeout": "0.2"})
		name, _, _ := strings.Cut(strings.Trim(field, `"`), `"`)
		if msg := errorMessage(t, rec.Body.Bytes()); rec.Code != http.StatusBadRequest || !strings.Contains(msg, name) || !strings.Contains(msg, "allow_fields") {
			t.Errorf("chat with %s: got %d %s, want 400 naming %s and allow_fields", field, rec.Code, rec.Body, name)
		}
	}
	f.queueEmpty(t)
	ctx := context.Background()
	accept := func(tenant, field string) error {
		_, err := f.svc.Accept(ctx, &task.Task{
			Job: job.Job{ID: job.NewID(), Tenant: tenant, Request: json.RawMessage(`{"model":"fast","max_tokens":16,` + hiMessages + `,` + field + `}`)},
		})
		return err
	}
	if err := accept("acme", `"store":false`); err != nil {
		t.Errorf("store false: %v, want accepted", err)
	}
	f.svc.cfg.App.Providers[0].Models[0].AllowFields = []string{"store", "metadata"}
	if err := accept("beta", `"store":true`); err != nil {
		t.Errorf("store true on a model that allows it: %v", err)
	}
	if err := accept("beta", `"metadata":{"k":"v"}`); err != nil {
		t.Errorf("metadata on a model that allows it: %v", err)
	}
}

// A Responses request for a provider serving the Responses API itself
// still carries its native member (set by the handler), and the estimate
// counts what the chat messages do not hold: here a built-in tool.
func TestNativeMemberFromResponsesHandler(t *testing.T) {
	t.Parallel()
	m := meshtest.New(t, streams.Options{})
	cfg, err := config.Parse([]byte(`
providers:
  - name: oa
    base_url: http://127.0.0.1:1/v1
    responses: native
    models: [{name: gpt-4o-mini, rpm: 100000, tpm: 100000000}]
tenants: [{name: acme}]
`))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{App: cfg}, m, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{svc: svc, mesh: m, js: m.JS, nc: m.JS.Conn()}
	mux := f.mux()
	tool := `{"type":"web_search","search_context_size":"` + strings.Repeat("high ", 200) + `"}`
	rec := post(mux, "/v1/responses", "acme", `{"model":"gpt-4o-mini","input":"hi","max_output_tokens":16,"tools":[`+tool+`]}`,
		map[string]string{"X-Sluice-Wait-Timeout": "0.05"})
	if rec.Code != http.StatusGatewayTimeout {
		t.Fatalf("POST /v1/responses with a built-in tool: %d %s, want it accepted (504 once the short wait ends)", rec.Code, rec.Body)
	}
	j := f.lastQueued(t, "acme")
	var body map[string]json.RawMessage
	if err := json.Unmarshal(j.Request, &body); err != nil || body[wire.NativeMember] == nil {
		t.Fatalf("queued request %s (%v): want the native member", j.Request, err)
	}
	if j.Estimate == nil || j.Estimate.PromptTokens < 200 {
		t.Errorf("estimate %+v: want the built-in tool's ~200 tokens counted", j.Estimate)
	}
	var ve *job.ValidationError
	if err := job.CheckProducerRequest("request", j.Request); !errors.As(err, &ve) {
		t.Errorf("the queued body as a producer's: %v, want refused", err)
	}
}
