package ingest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/streams"
)

// TestSubmitRidesThroughElection: while QUEUE has no leader (here it is
// gone for a moment, so a publish finds no responder, as during an
// election), an HTTP submission waits and is accepted once QUEUE is back,
// instead of a 503; the job is queued once.
func TestSubmitRidesThroughElection(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := f.js.DeleteStream(ctx, streams.Queue); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	f.svc.Routes(mux, api.Auth{Tenants: []string{"acme", "beta"}, Open: true})
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		body := `{"request":{"model":"fast","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}}`
		req := httptest.NewRequest(http.MethodPost, "/v1/jobs", strings.NewReader(body))
		req.Header.Set("X-Sluice-Tenant", "acme")
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		answered <- rec
	}()
	time.Sleep(3 * time.Second)
	if err := streams.Ensure(ctx, f.js, streams.Options{Queue: streams.Bounds{MaxMsgsPerSubject: 2}}); err != nil {
		t.Fatal(err)
	}
	rec := <-answered
	if rec.Code != http.StatusAccepted {
		t.Fatalf("POST /v1/jobs while QUEUE had no leader for 3 s: %d %s; want 202", rec.Code, rec.Body)
	}
	st, err := f.js.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("QUEUE holds %d jobs, want the one submitted", info.State.Msgs)
	}
}
