package node

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natstest"
)

// A connection the client closes for good (here as the server's refusal
// of a subject over its control line closes it) fails /healthz and ends
// Run with an error, so a supervisor restarts the process. Before, every
// service stopped, /readyz said 503, /healthz 200, and the process stayed.
func TestClosedConnectionEndsTheNode(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte("server: {open: true}\ntenants: [{name: acme}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan Info, 1)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Made before the node starts: its removal runs after the node stops.
	data := t.TempDir()
	go func() {
		done <- Run(ctx, Options{Config: cfg, NATSListen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Data: data,
			Services: []string{"result"}, OnReady: func(i Info) { ready <- i }})
	}()
	var info Info
	select {
	case info = <-ready:
	case err := <-done:
		t.Fatalf("Run ended before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not ready in 30s")
	}
	status := func(path string) int {
		resp, err := http.Get("http://" + info.HTTPAddr + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Ready, and healthy with the services consuming.
	for _, path := range []string{"/readyz", "/healthz"} {
		natstest.Eventually(t, 20*time.Second, func() error {
			if got := status(path); got != http.StatusOK {
				return fmt.Errorf("%s before: %d, want 200", path, got)
			}
			return nil
		})
	}
	// What a subject longer than the server's control line does.
	_ = info.conn.Publish(strings.Repeat("x", 5000), nil)
	_ = info.conn.Flush()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("Run after the connection closed: %v, want an error saying so", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("Run still running 20s after its connection closed (conn closed: %v, /healthz %d)", info.conn.IsClosed(), status("/healthz"))
	}
}

func TestHealthzFailsOnAClosedConnection(t *testing.T) {
	t.Parallel()
	nc := natstest.Conn(t, natstest.Server(t))
	rec := httptest.NewRecorder()
	healthz(nc).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("/healthz on an open connection: %d, want 200", rec.Code)
	}
	nc.Close()
	rec = httptest.NewRecorder()
	healthz(nc).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("/healthz on a closed connection: %d, want 503", rec.Code)
	}
}
