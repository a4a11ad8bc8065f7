package node

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
)

// /metrics names every tenant and its traffic: it is served on its own
// listener (server.metrics), never on the API listener callers reach; so
// is the profiler, and only when server.pprof asks for it.
func TestMetricsNotOnTheAPIListener(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		metrics string
		pprof   bool
	}{{"127.0.0.1:0", false}, {"127.0.0.1:0", true}, {"", false}} {
		metrics := c.metrics
		cfg, err := config.Parse([]byte("server: {open: true}\ntenants: [{name: acme}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Server.Metrics = metrics
		cfg.Server.Pprof = c.pprof
		ctx, cancel := context.WithCancel(context.Background())
		ready := make(chan Info, 1)
		done := make(chan error, 1)
		// Made before the node starts: its removal runs after the node stops.
		data := t.TempDir()
		go func() {
			done <- Run(ctx, Options{Config: cfg, NATSListen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Data: data,
				Services: []string{"ingest", "result"}, OnReady: func(i Info) { ready <- i }})
		}()
		var info Info
		select {
		case info = <-ready:
		case err := <-done:
			t.Fatalf("Run ended before it was ready: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("not ready in 30s")
		}
		get := func(url string) (int, string) {
			resp, err := http.Get(url)
			if err != nil {
				t.Fatalf("GET %s: %v", url, err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		for _, path := range []string{"/metrics", "/debug/pprof/"} {
			if code, _ := get("http://" + info.HTTPAddr + path); code != http.StatusNotFound {
				t.Errorf("server.metrics %q: GET %s on the API listener: %d, want 404", metrics, path, code)
			}
		}
		switch {
		case metrics == "" && info.MetricsAddr != "":
			t.Errorf("server.metrics empty: a metrics listener on %s, want none", info.MetricsAddr)
		case metrics != "":
			if code, body := get("http://" + info.MetricsAddr + "/metrics"); code != http.StatusOK || !strings.Contains(body, "sluice_") {
				t.Errorf("GET /metrics on the metrics listener: %d, want 200 with Sluice's metrics", code)
			}
			want := map[bool]int{true: http.StatusOK, false: http.StatusNotFound}[c.pprof]
			if code, _ := get("http://" + info.MetricsAddr + "/debug/pprof/goroutine?debug=1"); code != want {
				t.Errorf("server.pprof %v: GET /debug/pprof/goroutine on the metrics listener: %d, want %d", c.pprof, code, want)
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}
