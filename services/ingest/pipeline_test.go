package ingest

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// surfaceBodies is one request per submit-and-wait surface, for model fast.
var surfaceBodies = []struct{ path, body string }{
	{"/v1/chat/completions", chatHi},
	{"/v1/embeddings", `{"model":"fast","input":"hi"}`},
	{"/v1/messages", chatHi},
	{"/v1/responses", `{"model":"fast","input":"hi","max_output_tokens":16}`},
}

// refusal checks that rec is an error answer with status in path's API's
// shape (Anthropic's on /v1/messages, OpenAI's elsewhere, with code), and
// returns its message.
func refusal(t *testing.T, path string, rec *httptest.ResponseRecorder, status int, code string) string {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("%s: %d %s, want %d", path, rec.Code, rec.Body, status)
	}
	var body struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s: body %s: %v", path, rec.Body, err)
	}
	if path == "/v1/messages" {
		if body.Type != "error" || body.Error.Type != wire.AnthropicErrorType(status) || body.Error.Code != "" {
			t.Errorf("%s: body %s, want an Anthropic error of type %s", path, rec.Body, wire.AnthropicErrorType(status))
		}
	} else if body.Type != "" || body.Error.Code != code {
		t.Errorf("%s: body %s, want an OpenAI error with code %s", path, rec.Body, code)
	}
	return body.Error.Message
}

// Every surface answers the pipeline's refusals (a bad wait, a wait that
// ends without a result, a full queue) with the same status, headers and
// message, each in its own API's shape.
func TestSurfacesRenderRefusals(t *testing.T) {
	t.Parallel()
	for _, sf := range surfaceBodies {
		t.Run(strings.TrimPrefix(sf.path, "/v1/"), func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			mux := f.mux()
			rec := post(mux, sf.path, "acme", sf.body, map[string]string{"X-Sluice-Wait-Timeout": "soon"})
			if msg := refusal(t, sf.path, rec, http.StatusBadRequest, job.CodeInvalidRequest); !strings.HasPrefix(msg, "X-Sluice-Wait-Timeout: ") || rec.Header().Get("X-Should-Retry") != "false" {
				t.Errorf("bad wait: message %q, X-Should-Retry %q; want the header named, and no retry", msg, rec.Header().Get("X-Should-Retry"))
			}
			// QUEUE holds two of a tenant's jobs (setup): each waits, in vain.
			for range 2 {
				rec = post(mux, sf.path, "acme", sf.body, map[string]string{"X-Sluice-Wait-Timeout": "0.05"})
				id := rec.Header().Get("X-Sluice-Job-Id")
				if msg := refusal(t, sf.path, rec, http.StatusGatewayTimeout, "wait_timeout"); id == "" || !strings.Contains(msg, "GET /v1/jobs/"+id) || rec.Header().Get("X-Should-Retry") != "false" {
					t.Errorf("wait timeout: job %q, message %q, X-Should-Retry %q; want where to find the job, and no retry", id, msg, rec.Header().Get("X-Should-Retry"))
				}
			}
			rec = post(mux, sf.path, "acme", sf.body, nil)
			if msg := refusal(t, sf.path, rec, http.StatusTooManyRequests, job.CodeQueueFull); !strings.Contains(msg, "jobs ahead") || rec.Header().Get("Retry-After") == "" || rec.Header().Get("X-Sluice-Job-Id") != "" {
				t.Errorf("queue full: message %q, Retry-After %q, job %q; want the queue ahead, when to retry, and no job", msg, rec.Header().Get("Retry-After"), rec.Header().Get("X-Sluice-Job-Id"))
			}
		})
	}
}

// answerQueued ends, once QUEUE's last job of acme's is not job skip,
// that job with outcome o (through the mesh's one finish).
func (f *fixture) answerQueued(ctx context.Context, skip string, o mesh.Outcome) <-chan error {
	answered := make(chan error, 1)
	go func() {
		var j task.Task
		queued := natstest.Poll(ctx, func() bool {
			st, err := f.js.Stream(ctx, streams.Queue)
			if err != nil {
				return false
			}
			m, err := st.GetLastMsgForSubject(ctx, job.QueueSubject(job.Standard, "acme"))
			return err == nil && json.Unmarshal(m.Data, &j) == nil && j.ID != skip
		})
		if !queued {
			answered <- ctx.Err()
			return
		}
		_, err := f.mesh.Finish(ctx, &j, o, mesh.Exit{})
		answered <- err
	}()
	return answered
}

// A job's result reaches each surface rendered in its API's shape: a
// message with Anthropic's request-id (the provider's) on /v1/messages, a
// Response named after the job on /v1/responses; a failed job as the
// API's error, with the job's id.
func TestSurfacesRenderResults(t *testing.T) {
	t.Parallel()
	completion := `{"id":"c1","object":"chat.completion","model":"fast","choices":[{"index":0,"message":{"role":"assistant","content":"here"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`
	for _, sf := range surfaceBodies {
		if sf.path == "/v1/embeddings" {
			continue // the provider's body, as on chat completions
		}
		t.Run(strings.TrimPrefix(sf.path, "/v1/"), func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			mux := f.mux()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			answered := f.answerQueued(ctx, "", mesh.Outcome{Status: job.StatusSucceeded, Response: json.RawMessage(completion), ProviderRequestID: "req_up"})
			bounded := map[string]string{"X-Sluice-Wait-Timeout": "15"}
			rec := post(mux, sf.path, "acme", sf.body, bounded)
			if err := <-answered; err != nil {
				t.Fatal(err)
			}
			id := rec.Header().Get("X-Sluice-Job-Id")
			want := map[string]string{"/v1/chat/completions": `"chat.completion"`, "/v1/messages": `"type":"message"`, "/v1/responses": `"id":"resp_` + id + `"`}[sf.path]
			if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), want) || !strings.Contains(rec.Body.String(), "here") {
				t.Errorf("succeeded: %d %s, want 200 with %s", rec.Code, rec.Body, want)
			}
			if got := rec.Header().Get("X-Request-Id"); got != "req_up" {
				t.Errorf("X-Request-Id = %q, want the provider's", got)
			}
			if got, want := rec.Header().Get("Request-Id"), map[bool]string{true: "req_up"}[sf.path == "/v1/messages"]; got != want {
				t.Errorf("Request-Id = %q, want %q (Anthropic's name, on /v1/messages only)", got, want)
			}

			answered = f.answerQueued(ctx, id, mesh.Outcome{Status: job.StatusFailed, Error: &job.Error{Code: "server_error", Message: "upstream broke"}})
			rec = post(mux, sf.path, "acme", sf.body, bounded)
			if err := <-answered; err != nil {
				t.Fatal(err)
			}
			if msg := refusal(t, sf.path, rec, http.StatusBadGateway, "server_error"); msg != "upstream broke" || rec.Header().Get("X-Sluice-Job-Id") == "" || rec.Header().Get("X-Should-Retry") != "false" {
				t.Errorf("failed: message %q, job %q, X-Should-Retry %q; want the job's error, its id, and no retry", msg, rec.Header().Get("X-Sluice-Job-Id"), rec.Header().Get("X-Should-Retry"))
			}
		})
	}
}
