package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

const chatHi = `{"model":"fast","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`

func (f *fixture) mux() *http.ServeMux {
	mux := http.NewServeMux()
	f.svc.Routes(mux, api.Auth{Tenants: []string{"acme", "beta"}, Open: true})
	return mux
}

// post sends body to path as tenant with the given headers (Content-Type
// application/json unless headers set it).
func post(mux http.Handler, path, tenant, body string, headers map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("X-Sluice-Tenant", tenant)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	return rec
}

// lastQueued reads the last job QUEUE holds for tenant at standard priority.
func (f *fixture) lastQueued(t *testing.T, tenant string) *task.Task {
	t.Helper()
	return f.queued(t, job.Standard, tenant)
}

// A body not declared JSON is refused with 415 before it is read: a
// browser's cross-site POST without a preflight can only send a form,
// text/plain or nothing declared.
func TestContentTypeRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mux := f.mux()
	envelope := `{"request":` + chatHi + `}`
	for _, path := range []string{"/v1/chat/completions", "/v1/jobs", "/v1/embeddings", "/v1/messages"} {
		body := chatHi
		if path == "/v1/jobs" {
			body = envelope
		}
		for _, ct := range []string{"", "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/json; charset=latin1"} {
			rec := post(mux, path, "acme", body, map[string]string{"Content-Type": ct, "X-Sluice-Wait-Timeout": "0.01"})
			if rec.Code != http.StatusUnsupportedMediaType || !strings.Contains(rec.Body.String(), "application/json") {
				t.Errorf("POST %s with Content-Type %q: got %d %s, want 415 naming application/json", path, ct, rec.Code, rec.Body)
			}
		}
	}
	// What SDKs send is served.
	// (QUEUE holds 2 jobs per tenant here.)
	for i, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON"} {
		if rec := post(mux, "/v1/jobs", []string{"beta", "beta", "acme"}[i], envelope, map[string]string{"Content-Type": ct}); rec.Code != http.StatusAccepted {
			t.Errorf("POST /v1/jobs with Content-Type %q: got %d %s, want 202", ct, rec.Code, rec.Body)
		}
	}
}

// A body that is not UTF-8 is refused: the JSON decoder would read the
// bad bytes as U+FFFD while the provider would get them as they are.
func TestInvalidUTF8Refused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mux := f.mux()
	bad := strings.Replace(chatHi, `"hi"`, "\"h\xffi\"", 1)
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", bad},
		{"/v1/jobs", `{"request":` + bad + `}`},
		{"/v1/messages", bad},
	} {
		rec := post(mux, tc.path, "acme", tc.body, map[string]string{"X-Sluice-Wait-Timeout": "0.5"})
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "UTF-8") {
			t.Errorf("POST %s with an invalid UTF-8 byte: got %d %s, want 400 naming UTF-8", tc.path, rec.Code, rec.Body)
		}
	}
	ctx := context.Background()
	st, err := f.js.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Errorf("QUEUE after refused bodies: %v jobs (%v), want none", info.State.Msgs, err)
	}
}

// A decode error names the field and the JSON type it must be, as
// OpenAI's API does, never Go's types.
func TestDecodeErrorWording(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mux := f.mux()
	rec := post(mux, "/v1/chat/completions", "acme", `{"model":"fast","max_tokens":"16","messages":[{"role":"user","content":"hi"}]}`, nil)
	var body struct {
		Error struct {
			Message string `json:"message"`
			Param   string `json:"param"`
		} `json:"error"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	if rec.Code != http.StatusBadRequest || body.Error.Param != "max_tokens" || !strings.Contains(body.Error.Message, "expected an integer, but got a string") {
		t.Errorf("max_tokens as a string: got %d %s, want 400 with param max_tokens saying it expected an integer", rec.Code, rec.Body)
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/messages", "/v1/jobs"} {
		b := `{"model":"fast","max_tokens":"16","messages":[{"role":"user","content":"hi"}]}`
		if path == "/v1/jobs" {
			b = `{"priority":1,"request":` + chatHi + `}`
		}
		rec := post(mux, path, "acme", b, map[string]string{"X-Sluice-Wait-Timeout": "0.5"})
		if s := rec.Body.String(); rec.Code != http.StatusBadRequest || strings.Contains(s, "Go ") || strings.Contains(s, "ChatRequest") || strings.Contains(s, "of type") {
			t.Errorf("POST %s with a field of the wrong type: got %d %s, want 400 without Go's types", path, rec.Code, s)
		}
	}
}

// An idempotency key names one operation: the same key with another
// request is refused (422), with the same request it joins.
func TestIdempotencyKeyBodyMismatch(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mux := f.mux()
	first := `{"request":{"model":"fast","max_tokens":16,"messages":[{"role":"user","content":"first"}]}}`
	other := `{"request":{"model":"fast","max_tokens":16,"messages":[{"role":"user","content":"second"}]}}`
	key := map[string]string{"Idempotency-Key": "order-17"}
	rec := post(mux, "/v1/jobs", "acme", first, key)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("first submission: %d %s", rec.Code, rec.Body)
	}
	var acc struct{ ID string }
	_ = json.Unmarshal(rec.Body.Bytes(), &acc)
	// The executor writes the record in flight with the digest it
	// computes from the job it reads: the same as ingest's.
	queued := f.lastQueued(t, "acme")
	ctx := context.Background()
	opKey, _ := mesh.OpKey("acme", "order-17", queued.ID)
	op, rev, err := f.mesh.GetOp(ctx, opKey)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := mesh.BodyDigest(queued), op.BodyDigest; got != want || want == "" {
		t.Fatalf("digest of the queued job %q, in the record %q: want equal and set", got, want)
	}
	inFlight := &mesh.OpRecord{Key: op.Key, JobID: op.JobID, Tenant: "acme", State: mesh.OpInFlight, Provider: "p", Model: "fast", Attempt: 1,
		BodyDigest: mesh.BodyDigest(queued)}
	if _, err := f.mesh.PutOpAt(ctx, opKey, inFlight, rev); err != nil {
		t.Fatal(err)
	}

	rec = post(mux, "/v1/jobs", "acme", other, key)
	if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), job.CodeIdempotencyMismatch) {
		t.Errorf("same key, another request: got %d %s, want 422 %s", rec.Code, rec.Body, job.CodeIdempotencyMismatch)
	}
	// Over NATS too.
	j := &task.Task{Job: job.Job{Tenant: "acme", IdempotencyKey: "order-17", Request: json.RawMessage(`{"model":"fast","max_tokens":16,"messages":[{"role":"user","content":"third"}]}`)}}
	if _, err := f.svc.Accept(ctx, j); err == nil || !strings.Contains(err.Error(), "different request") {
		t.Errorf("Accept with the same key and another request: %v, want the mismatch refused", err)
	}
	// The same request, written differently (spaces), joins.
	same := `{ "request": { "model": "fast", "max_tokens": 16, "messages": [ { "role": "user", "content": "first" } ] } }`
	rec = post(mux, "/v1/jobs", "acme", same, key)
	if rec.Code != http.StatusAccepted || !strings.Contains(rec.Body.String(), `"joined":true`) || !strings.Contains(rec.Body.String(), acc.ID) {
		t.Errorf("same key, same request: got %d %s, want 202 joined to %s", rec.Code, rec.Body, acc.ID)
	}
}

// A body that is not compact JSON is sealed as QUEUE carries it, so the
// seal verifies at the next hop instead of the job being estimated again
// (and a warning logged) at every delivery.
func TestNonCompactBodyVerifies(t *testing.T) {
	t.Parallel()
	f := setup(t)
	body := "{\n  \"model\": \"fast\",\n  \"max_tokens\": 16,\n  \"messages\": [{\"role\": \"user\", \"content\": \"a <b> & c \u2028\"}]\n}"
	if _, err := f.svc.Accept(context.Background(), &task.Task{Job: job.Job{Tenant: "beta", Request: json.RawMessage(body)}}); err != nil {
		t.Fatal(err)
	}
	if j := f.lastQueued(t, "beta"); !f.svc.cfg.Guard.Sealed(j) {
		t.Errorf("the queued job's seal does not verify (request %s)", j.Request)
	}
	// Through HTTP as well.
	rec := post(f.mux(), "/v1/jobs", "acme", "{ \"request\" : "+body+" }", nil)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("POST /v1/jobs: %d %s", rec.Code, rec.Body)
	}
	if j := f.lastQueued(t, "acme"); !f.svc.cfg.Guard.Sealed(j) {
		t.Errorf("the queued job's seal does not verify (request %s)", j.Request)
	}
}

// An answer slower than the server's write timeout reaches a
// /v1/messages caller, as it reaches a chat caller: the wait extends the
// connection's deadlines through the Anthropic wrapper. (The 70 s
// against a 60 s write timeout, scaled down.)
func TestMessagesAnswerSlowerThanWriteTimeout(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const writeTimeout = 300 * time.Millisecond
	ts := httptest.NewUnstartedServer(f.mux())
	ts.Config.WriteTimeout = writeTimeout
	ts.Start()
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	answered := make(chan error, 1)
	go func() {
		// The job's result, written well after the write timeout.
		var j task.Task
		queued := natstest.Poll(ctx, func() bool {
			st, err := f.js.Stream(ctx, streams.Queue)
			if err != nil {
				return false
			}
			m, err := st.GetLastMsgForSubject(ctx, job.QueueSubject(job.Standard, "acme"))
			return err == nil && json.Unmarshal(m.Data, &j) == nil
		})
		if !queued {
			answered <- ctx.Err()
			return
		}
		// Time is what is tested: the answer must come after the server's
		// write deadline (net/http's, on the wall clock) has passed.
		time.Sleep(3 * writeTimeout)
		completion := `{"id":"c1","object":"chat.completion","model":"fast","choices":[{"index":0,"message":{"role":"assistant","content":"slow but here"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`
		_, err := f.mesh.Finish(ctx, &j, mesh.Outcome{Status: job.StatusSucceeded, Response: json.RawMessage(completion)}, mesh.Exit{})
		answered <- err
	}()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/messages", bytes.NewReader([]byte(chatHi)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("X-Sluice-Tenant", "acme")
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatalf("POST /v1/messages answered after the write timeout: %v, want the answer", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "slow but here") {
		t.Errorf("POST /v1/messages: %d %s (%v), want 200 with the message", resp.StatusCode, b, err)
	}
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
}
