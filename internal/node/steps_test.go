package node

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/health"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/services/batches"
	"github.com/sluice-dev/sluice/services/result"
)

func parse(t *testing.T, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestOptionsWithDefaults(t *testing.T) {
	t.Parallel()
	if _, err := (Options{}).withDefaults(); err == nil {
		t.Error("no configuration: got no error")
	}
	o, err := Options{Config: parse(t, "server: {open: true}\n")}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Services, AllServices) {
		t.Errorf("services: got %v, want %v", o.Services, AllServices)
	}
	if o.Getenv == nil || o.Log == nil {
		t.Error("getenv or log left nil")
	}
	if len(o.Config.Tenants) != 1 || o.Config.Tenants[0].Name != config.DefaultTenant {
		t.Errorf("open mode without tenants: got tenants %v, want only %q", o.Config.Tenants, config.DefaultTenant)
	}
	o, err = Options{Config: parse(t, "tenants: [{name: acme}]\n"), Services: []string{"result"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Services, []string{"result"}) || len(o.Config.Tenants) != 1 || o.Config.Tenants[0].Name != "acme" {
		t.Errorf("given services and tenants: got %v and %v, want them kept", o.Services, o.Config.Tenants)
	}
}

func TestStartNATSJoinsAGivenServer(t *testing.T) {
	t.Parallel()
	ns, url, err := startNATS(Options{Config: parse(t, "{}\n"), NATSURL: "nats://127.0.0.1:4222"}, discard())
	if err != nil || ns != nil || url != "nats://127.0.0.1:4222" {
		t.Errorf("got server %v, url %q, err %v; want no server and the URL given", ns, url, err)
	}
}

func TestNewMetricsSetsConfiguredLimits(t *testing.T) {
	t.Parallel()
	cfg := parse(t, `
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: m, rpm: 60, tpm: 6000, max_concurrency: 3, units: {images: 7}}]
`)
	reg, _ := newMetrics(cfg)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "sluice_model_limit" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["provider"] == "p" && labels["model"] == "m" {
				got[labels["limit"]] = m.GetGauge().GetValue()
			}
		}
	}
	for limit, want := range map[string]float64{"rpm": 60, "tpm": 6000, "concurrency": 3, "images_per_minute": 7} {
		if got[limit] != want {
			t.Errorf("sluice_model_limit{limit=%q}: got %g, want %g", limit, got[limit], want)
		}
	}
}

func TestReadyz(t *testing.T) {
	t.Parallel()
	nc := natstest.Conn(t, natstest.Server(t))
	get := func(h http.Handler) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	ok := func() error { return nil }
	if code, body := get(readyz(nc, []func() error{ok})); code != http.StatusOK || body != "ready\n" {
		t.Errorf("all ready: got %d %q, want 200 ready", code, body)
	}
	notYet := func() error { return errors.New("admission: not caught up") }
	if code, body := get(readyz(nc, []func() error{ok, notYet})); code != http.StatusServiceUnavailable || !strings.Contains(body, "not caught up") {
		t.Errorf("a check failing: got %d %q, want 503 naming it", code, body)
	}
	some := func() error { return &degraded{why: "deployments down: p/m"} }
	if code, body := get(readyz(nc, []func() error{ok, some})); code != http.StatusOK || body != "degraded: deployments down: p/m\n" {
		t.Errorf("some deployments down: got %d %q, want 200 degraded naming them", code, body)
	}
	if code, _ := get(readyz(nc, []func() error{some, notYet})); code != http.StatusServiceUnavailable {
		t.Errorf("degraded and a check failing: got %d, want 503", code)
	}
	nc.Close()
	if code, body := get(readyz(nc, nil)); code != http.StatusServiceUnavailable || !strings.Contains(body, "not connected") {
		t.Errorf("connection closed: got %d %q, want 503 not connected", code, body)
	}
}

func TestConnClosed(t *testing.T) {
	t.Parallel()
	nc := natstest.Conn(t, natstest.Server(t))
	closed := make(chan struct{})
	close(closed)
	if err := connClosed(context.Background(), nc, closed); err == nil || !strings.Contains(err.Error(), "closed for good") {
		t.Errorf("closed: got %v, want an error saying the connection closed", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := connClosed(ctx, nc, make(chan struct{})); !errors.Is(err, context.Canceled) {
		t.Errorf("ctx ended: got %v, want context.Canceled", err)
	}
}

// The steps Run takes before it serves, one after another on an embedded
// server: the streams and buckets are made, the fleet key loaded for the
// services that seal or verify jobs (not for the result service alone),
// and the services built in the order given.
func TestSetUpAndBuildServices(t *testing.T) {
	t.Parallel()
	o, err := Options{Config: parse(t, "server: {open: true}\ntenants: [{name: acme}]\n"), NATSListen: "127.0.0.1:0", Data: t.TempDir(),
		Services: []string{"result", "admission", "ingest"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ns, url, err := startNATS(o, o.Log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	c, err := connect(o, ns, url, o.Log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := setUp(ctx, o, config.NewLive(o.Config), url, c, o.Log)
	if err != nil {
		t.Fatal(err)
	}
	if st.mesh == nil || st.mesh.Results == nil || st.mesh.Fleet == nil || st.guard == nil || st.cache == nil {
		t.Fatalf("set up: got %+v; want the mesh, the guard and the cache bucket", st)
	}
	resultOnly := o
	resultOnly.Services = []string{"result"}
	if st, err := setUp(ctx, resultOnly, config.NewLive(resultOnly.Config), url, c, o.Log); err != nil || st.guard != nil || st.cache != nil {
		t.Errorf("result only: got %+v, err %v; want no guard and no cache bucket", st, err)
	}
	reg, ms := newMetrics(o.Config)
	mux := http.NewServeMux()
	auth, err := httpAuth(o, o.Log)
	if err != nil {
		t.Fatal(err)
	}
	services, readiness, err := newServices(o, config.NewLive(o.Config), st, nil, reg, ms, auth, mux)
	if err != nil {
		t.Fatal(err)
	}
	if len(services) != 5 || len(readiness) != 2 {
		t.Fatalf("got %d services and %d readiness checks, want 3, ingest's batches and the deployments' health, and 2 (admission's, the deployments')", len(services), len(readiness))
	}
	if _, ok := services[3].(*batches.Service); !ok {
		t.Errorf("fourth service: got %T, want callers' batches (with ingest, after the services given)", services[3])
	}
	if _, ok := services[4].(*health.Registry); !ok {
		t.Errorf("last service: got %T, want the deployments' health", services[4])
	}
	if _, ok := services[0].(*result.Service); !ok {
		t.Errorf("first service: got %T, want the result service (the order given)", services[0])
	}
	for _, route := range []string{"POST /v1/chat/completions", "GET /v1/jobs/x", "POST /v1/batches"} {
		method, path, _ := strings.Cut(route, " ")
		if _, pattern := mux.Handler(httptest.NewRequest(method, path, nil)); pattern == "" {
			t.Errorf("%s: no route", route)
		}
	}
}

// fakeService runs until ctx ends, or returns err at once when set.
type fakeService struct {
	err     error
	quit    bool // return nil at once
	stopped chan struct{}
}

func (f *fakeService) Run(ctx context.Context) error {
	defer close(f.stopped)
	if f.err != nil || f.quit {
		return f.err
	}
	<-ctx.Done()
	return nil
}

func TestServe(t *testing.T) {
	t.Parallel()
	ns := natstest.Server(t)
	for _, tc := range []struct {
		name    string
		svc     *fakeService
		cancel  bool
		wantErr string // "" for nil
	}{
		{"requested stop", &fakeService{}, true, ""},
		{"service fails", &fakeService{err: errors.New("boom")}, false, "svc: boom"},
		{"service stops by itself", &fakeService{quit: true}, false, "svc: stopped unexpectedly"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.svc.stopped = make(chan struct{})
			c := &link{nc: natstest.Conn(t, ns), closed: make(chan struct{})}
			o := Options{Config: parse(t, "{}\n"), Services: []string{"svc"}, Log: discard()}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ready := make(chan Info, 1)
			o.OnReady = func(i Info) { ready <- i }
			done := make(chan error, 1)
			go func() {
				done <- serve(ctx, o, c, "nats://x", []runner{tc.svc}, http.NewServeMux(), prometheus.NewRegistry(), o.Log)
			}()
			if tc.cancel {
				<-ready
				cancel()
			}
			select {
			case err := <-done:
				if (err == nil) != (tc.wantErr == "") || (err != nil && err.Error() != tc.wantErr) {
					t.Errorf("got %v, want %q", err, tc.wantErr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("serve did not return in 10s")
			}
			select {
			case <-tc.svc.stopped:
			default:
				t.Error("serve returned with the service still running")
			}
		})
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
