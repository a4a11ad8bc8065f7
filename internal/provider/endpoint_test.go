package provider

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
)

// An embeddings call goes to {base}/embeddings with the body untouched, and
// its usage and request id are read like a chat call's.
func TestOpenAIEmbeddingsEndpoint(t *testing.T) {
	t.Parallel()
	var path, got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.Path
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		w.Header().Set("x-request-id", "req_emb")
		_, _ = w.Write([]byte(`{"object":"list","data":[],"model":"e","usage":{"prompt_tokens":9,"total_tokens":9}}`))
	}))
	defer srv.Close()
	body := `{"model":"e","input":["a","b"]}`
	resp, err := newOpenAI(t, srv.URL, time.Second).Do(context.Background(), Call{Endpoint: job.EndpointEmbeddings, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	if path != "/v1/embeddings" || got != body {
		t.Errorf("POST %s %s, want /v1/embeddings with the body untouched", path, got)
	}
	if resp.Usage.PromptTokens != 9 || resp.Usage.TotalTokens != 9 || RequestID(resp.Header) != "req_emb" {
		t.Errorf("usage %+v, request id %q", resp.Usage, RequestID(resp.Header))
	}
}

// Anthropic has no embeddings API and no n: nothing is sent.
func TestAnthropicRefusesWhatItCannotServe(t *testing.T) {
	t.Parallel()
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls++ }))
	defer srv.Close()
	a := NewAnthropic(AnthropicConfig{BaseURL: srv.URL})
	for _, c := range []Call{
		{Endpoint: job.EndpointEmbeddings, Model: "claude", Body: []byte(`{"model":"claude","input":"a"}`)},
		{Model: "claude", Body: []byte(`{"model":"claude","n":2,"messages":[{"role":"user","content":"hi"}]}`)},
	} {
		_, err := a.Do(context.Background(), c)
		var te *TransportError
		if !errors.As(err, &te) || te.Phase != PhaseBuild {
			t.Errorf("%s: got %v, want a PhaseBuild error", c.Body, err)
		}
	}
	if calls != 0 {
		t.Errorf("the provider got %d calls, want 0", calls)
	}
}
