package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// queued reads the job QUEUE holds last for tenant at priority p.
func (f *fixture) queued(t *testing.T, p job.Priority, tenant string) *task.Task {
	t.Helper()
	ctx := context.Background()
	st, err := f.js.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, job.QueueSubject(p, tenant))
	if err != nil {
		t.Fatalf("QUEUE holds no job of %s: %v", tenant, err)
	}
	var j task.Task
	if err := json.Unmarshal(m.Data, &j); err != nil {
		t.Fatal(err)
	}
	return &j
}

// A body that names no output bound reaches QUEUE (whose request the
// executor forwards as it is) with the default_max_tokens its reservation
// assumed, so omitting max_tokens does not let the provider pick the length.
func TestDefaultMaxTokensIsSent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	for _, body := range []string{
		`{"model":"fast","messages":[{"role":"user","content":"hi"}]}`,
		"{\"model\":\"fast\",\"max_tokens\":null,\"messages\":[{\"role\":\"user\",\"content\":\"<hi>\"}]}\n",
	} {
		j := &task.Task{Job: job.Job{ID: job.NewID(), Tenant: "beta", Request: json.RawMessage(body)}}
		if _, err := f.svc.Accept(ctx, j); err != nil {
			t.Fatalf("accept %s: %v", body, err)
		}
		got := f.queued(t, job.Standard, "beta")
		req, err := job.ParseRequest(got.Request, job.DefaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		if want := f.svc.cfg.App.Limits.DefaultMaxTokens; req.MaxTokens == nil || *req.MaxTokens != want || got.Estimate.MaxTokens != want {
			t.Errorf("body %s: forwarded max_tokens %v, reserved %d; want both %d", body, req.MaxTokens, got.Estimate.MaxTokens, want)
		}
		if req.Messages[0].Text() != "hi" && req.Messages[0].Text() != "<hi>" {
			t.Errorf("body %s: message now %q", body, req.Messages[0].Text())
		}
		if _, _, err := f.mesh.Lookup(ctx, j.Tenant, j.ID); err != nil {
			t.Fatal(err)
		}
		// Room for the next one (QUEUE holds 2 per tenant and priority).
		st, _ := f.js.Stream(ctx, streams.Queue)
		_ = st.Purge(ctx)
	}
}

func TestShapeBodyReasoningModel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ kind, model, want string }{
		{"openai", "o3-mini", `"max_completion_tokens":300}`},
		{"openai", "gpt-4o-mini", `"max_tokens":300}`},
		{"anthropic", "claude-haiku-4-5", `"max_tokens":300}`},
	} {
		j := &task.Task{Job: job.Job{Request: json.RawMessage(`{"model":"` + tc.model + `","messages":[]}`)}}
		if err := shapeBody(j, &config.Provider{Kind: tc.kind}, &config.Model{Name: tc.model}, 300); err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(string(j.Request), tc.want) {
			t.Errorf("%s %s: body %s, want it to end %s", tc.kind, tc.model, j.Request, tc.want)
		}
	}
}

// A caller's max_tokens reaches an OpenAI reasoning model as
// max_completion_tokens, the only name it takes; other models keep theirs.
func TestShapeBodyRenamesForReasoningModel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ kind, model, body, want string }{
		{"openai", "o3-mini", `{"model":"o3-mini","max_tokens":50,"messages":[]}`, `{"max_completion_tokens":50,"messages":[],"model":"o3-mini"}`},
		{"openai", "o3-mini", `{"model":"o3-mini","max_completion_tokens":70,"messages":[]}`, `{"model":"o3-mini","max_completion_tokens":70,"messages":[]}`},
		{"openai", "gpt-4o-mini", `{"model":"gpt-4o-mini","max_tokens":50,"messages":[]}`, `{"model":"gpt-4o-mini","max_tokens":50,"messages":[]}`},
		{"anthropic", "claude-haiku-4-5", `{"model":"claude-haiku-4-5","max_tokens":50,"messages":[]}`, `{"model":"claude-haiku-4-5","max_tokens":50,"messages":[]}`},
	} {
		j := &task.Task{Job: job.Job{Request: json.RawMessage(tc.body)}}
		if err := shapeBody(j, &config.Provider{Kind: tc.kind}, &config.Model{Name: tc.model}, 300); err != nil {
			t.Fatal(err)
		}
		if string(j.Request) != tc.want {
			t.Errorf("%s %s: body %s, want %s", tc.kind, tc.model, j.Request, tc.want)
		}
	}
}

// An empty object gains the field as valid JSON.
func TestShapeBodyEmptyObject(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{}`, "{ }\n"} {
		j := &task.Task{Job: job.Job{Request: json.RawMessage(body)}}
		if err := shapeBody(j, &config.Provider{Kind: "openai"}, &config.Model{Name: "gpt-4o-mini"}, 300); err != nil {
			t.Fatal(err)
		}
		if !json.Valid(j.Request) || !strings.Contains(string(j.Request), `"max_tokens":300`) {
			t.Errorf("body %q shaped to %s, want a valid object with max_tokens 300", body, j.Request)
		}
	}
}

// A billing-relevant body field the budgets do not see is refused with a
// 400 naming it, unless the model allows it.
func TestDeniedBodyFieldRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	j := &task.Task{
		Job: job.Job{ID: job.NewID(), Tenant: "acme", Request: json.RawMessage(`{"model":"fast","service_tier":"priority","messages":[{"role":"user","content":"hi"}]}`)},
	}
	_, err := f.svc.Accept(ctx, j)
	var ve *job.ValidationError
	if !errors.As(err, &ve) || ve.Field != "request.service_tier" {
		t.Fatalf("accept with service_tier: got %v, want a validation error on request.service_tier", err)
	}
	mux := http.NewServeMux()
	f.svc.Routes(mux, api.Auth{Tenants: []string{"acme", "beta"}, Open: true})
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"fast","web_search_options":{},"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Sluice-Tenant", "acme")
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "web_search_options") {
		t.Errorf("POST with web_search_options: %d %s; want 400 naming the field", rec.Code, rec.Body)
	}
	f.svc.cfg.App.Providers[0].Models[0].AllowFields = []string{"service_tier"}
	if _, err := f.svc.Accept(ctx, j); err != nil {
		t.Errorf("service_tier on a model that allows it: %v", err)
	}
}
