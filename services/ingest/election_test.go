package ingest

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
	// The service says when a submission was refused and rides on.
	riding := &logSignal{prefix: "http submit: the streams are electing a leader", ch: make(chan struct{})}
	f.svc.log = slog.New(riding)
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
	select {
	case <-riding.ch:
	case <-ctx.Done():
		t.Fatal("the submission was never refused for want of QUEUE")
	}
	if err := streams.Ensure(ctx, f.js, streams.Options{Queue: streams.Bounds{MaxMsgsPerSubject: 2}}); err != nil {
		t.Fatal(err)
	}
	rec := <-answered
	if rec.Code != http.StatusAccepted {
		t.Fatalf("POST /v1/jobs while QUEUE had no leader: %d %s; want 202", rec.Code, rec.Body)
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

// logSignal is a log handler that closes ch at the first record whose
// message starts with prefix.
type logSignal struct {
	prefix string
	ch     chan struct{}
	once   sync.Once
}

func (h *logSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h *logSignal) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logSignal) WithGroup(string) slog.Handler            { return h }

func (h *logSignal) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.once.Do(func() { close(h.ch) })
	}
	return nil
}
