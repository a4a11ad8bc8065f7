// Package node runs a Sluice process: optionally an embedded NATS server,
// the JetStream objects, any subset of the four services, and the HTTP
// server (API, /healthz, /readyz, /metrics). `sluice up`, `sluice demo` and
// the end-to-end tests all start Sluice through Run.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/natstest"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/services/executor"
	"github.com/sluice-dev/sluice/services/ingest"
	"github.com/sluice-dev/sluice/services/result"
	"github.com/sluice-dev/sluice/streams"
)

// AllServices are the services a node runs by default.
var AllServices = []string{"ingest", "admission", "executor", "result"}

// Options configure a node.
type Options struct {
	Config     *config.Config
	NATSURL    string // join this NATS; empty embeds a server
	NATSListen string // the embedded server's address
	HTTP       string // API address; empty disables HTTP
	Data       string // data directory (embedded JetStream store)
	Services   []string
	Getenv     func(string) string
	Log        *slog.Logger
	// Executor overrides executor settings (tests).
	Executor func(*executor.Config)
	// OnReady is called once everything is serving.
	OnReady func(Info)
}

// Info describes a running node.
type Info struct {
	NATSURL  string
	HTTPAddr string
	Registry *prometheus.Registry
}

// ParseServices checks a comma-separated service list.
func ParseServices(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" || s == "all" {
		return AllServices, nil
	}
	var out []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(AllServices, name) {
			return nil, fmt.Errorf("unknown service %q (want some of %s)", name, strings.Join(AllServices, ","))
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out, nil
}

type runner interface {
	Run(ctx context.Context) error
}

// Run starts the node and blocks until ctx ends or a part fails. It returns
// nil on a requested shutdown.
func Run(ctx context.Context, o Options) error {
	if o.Config == nil {
		return errors.New("node: no configuration")
	}
	if o.Getenv == nil {
		o.Getenv = func(string) string { return "" }
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if len(o.Services) == 0 {
		o.Services = AllServices
	}
	log := o.Log

	natsURL := o.NATSURL
	var ns *server.Server
	if natsURL == "" {
		var err error
		ns, err = natstest.Start(natstest.Options{Listen: o.NATSListen, StoreDir: filepath.Join(o.Data, "jetstream")})
		if err != nil {
			return err
		}
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
		natsURL = ns.ClientURL()
		log.Info("embedded nats started", "url", natsURL, "store", filepath.Join(o.Data, "jetstream"))
	}
	nc, err := nats.Connect(natsURL, nats.Name("sluice "+strings.Join(o.Services, ",")),
		nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return fmt.Errorf("connect nats %s: %w", natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := waitConnected(setupCtx, nc); err != nil {
		return fmt.Errorf("connect nats %s: %w", natsURL, err)
	}
	if err := o.Config.Limits.CheckPayload(nc.MaxPayload()); err != nil {
		return err
	}
	if err := streams.Ensure(setupCtx, js, streamOptions(o.Config)); err != nil {
		return err
	}
	m, err := mesh.Open(setupCtx, js)
	if err != nil {
		return err
	}
	key, err := guard.LoadKey(setupCtx, m.Budgets)
	if err != nil {
		return err
	}
	gd := guard.New(o.Config, key)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ms := metrics.New(reg)
	ms.Preset(o.Config)
	for _, p := range o.Config.Providers {
		for _, m := range p.Models {
			ms.ModelLimit.WithLabelValues(p.Name, m.Name, "rpm").Set(float64(m.RPM))
			ms.ModelLimit.WithLabelValues(p.Name, m.Name, "tpm").Set(float64(m.TPM))
			ms.ModelLimit.WithLabelValues(p.Name, m.Name, "concurrency").Set(float64(m.MaxConcurrency))
		}
	}
	var tenants []string
	for _, t := range o.Config.Tenants {
		tenants = append(tenants, t.Name)
	}
	auth := api.Auth{Keys: o.Config.TenantKeys(o.Getenv), Tenants: tenants}
	mux := http.NewServeMux()
	cal := calib.New(m.Budgets, nil)
	var services []runner
	var readiness []func() error
	for _, name := range o.Services {
		switch name {
		case "ingest":
			s, err := ingest.New(ingest.Config{App: o.Config, Calib: cal, Guard: gd}, m, log, ms)
			if err != nil {
				return err
			}
			s.Routes(mux, auth)
			services = append(services, s)
		case "admission":
			s, err := admission.New(admission.Config{App: o.Config, Guard: gd}, m, log, ms)
			if err != nil {
				return err
			}
			readiness = append(readiness, s.Ready)
			services = append(services, s)
		case "executor":
			cfg := executor.Config{App: o.Config, Getenv: o.Getenv, Calib: cal, Guard: gd}
			if o.Executor != nil {
				o.Executor(&cfg)
			}
			s, err := executor.New(cfg, m, log, ms)
			if err != nil {
				return err
			}
			services = append(services, s)
		case "result":
			s, err := result.New(result.Config{}, m, log, ms)
			if err != nil {
				return err
			}
			s.Routes(mux, auth)
			services = append(services, s)
		}
	}
	if len(auth.Keys) == 0 && slices.Contains(o.Services, "ingest") && o.HTTP != "" {
		log.Warn("no tenant API keys configured: the HTTP API is open (tenant from X-Sluice-Tenant)")
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !nc.IsConnected() {
			http.Error(w, "nats: not connected", http.StatusServiceUnavailable)
			return
		}
		for _, ready := range readiness {
			if err := ready(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))

	var g run.Group
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errStopped := errors.New("stopped")
	g.Add(func() error {
		<-runCtx.Done()
		return errStopped
	}, func(error) { stop() })
	svcCtx, stopServices := context.WithCancel(context.Background())
	defer stopServices()
	for i, s := range services {
		name := o.Services[i]
		g.Add(func() error {
			if err := s.Run(svcCtx); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if svcCtx.Err() == nil {
				return fmt.Errorf("%s: stopped unexpectedly", name)
			}
			return nil
		}, func(error) { stopServices() })
	}
	httpAddr := ""
	if o.HTTP != "" {
		ln, err := net.Listen("tcp", o.HTTP)
		if err != nil {
			return fmt.Errorf("listen http %s: %w", o.HTTP, err)
		}
		httpAddr = ln.Addr().String()
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		g.Add(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("http: %w", err)
			}
			return nil
		}, func(error) {
			sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
			defer c()
			_ = srv.Shutdown(sctx)
		})
		log.Info("http listening", "addr", httpAddr)
	}
	if o.OnReady != nil {
		o.OnReady(Info{NATSURL: natsURL, HTTPAddr: httpAddr, Registry: reg})
	}
	log.Info("sluice up", "services", strings.Join(o.Services, ","), "nats", natsURL)
	err = g.Run()
	if errors.Is(err, errStopped) {
		return nil
	}
	return err
}

// streamOptions are the stream settings a configuration asks for.
func streamOptions(c *config.Config) streams.Options {
	bounds := func(b config.StreamBounds) streams.Bounds {
		return streams.Bounds{MaxMsgs: b.MaxMsgs, MaxBytes: b.MaxBytes, MaxMsgsPerSubject: b.MaxPerTenant}
	}
	return streams.Options{Replicas: c.Server.Replicas, ResultRetention: c.Limits.ResultRetention.D(), StreamReplay: c.Streaming.Replay.D(),
		Intake: bounds(c.Queues.Intake), Queue: bounds(c.Queues.Queue),
		JobMsgBytes: int32(c.Limits.JobMsgBytes()), ResultMsgBytes: int32(c.Limits.ResultMsgBytes())}
}

func waitConnected(ctx context.Context, nc *nats.Conn) error {
	for !nc.IsConnected() {
		select {
		case <-ctx.Done():
			return errors.New("not connected")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
