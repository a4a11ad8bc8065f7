package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"time"

	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/config"
)

// servesAPI reports whether the node serves the HTTP API: it has an HTTP
// address and runs ingest (submit) or result (read).
func servesAPI(o Options) bool {
	return o.HTTP != "" && (slices.Contains(o.Services, "ingest") || slices.Contains(o.Services, "result"))
}

// withOpenTenant returns c, or in open mode with no tenant configured a
// copy of c with one tenant, config.DefaultTenant, so keyless development
// requests have a tenant that every service knows.
func withOpenTenant(c *config.Config) *config.Config {
	if !c.Server.Open || len(c.Tenants) > 0 {
		return c
	}
	cp := *c
	cp.Tenants = []config.Tenant{{Name: config.DefaultTenant, Weight: 1}}
	return &cp
}

// httpAuth resolves the tenants' API keys and fails closed: a node that
// serves the HTTP API with no key refuses to start unless the config asks
// for development mode (server.open), which it then says at every start.
// A key variable that is unset or empty, or a key two tenants share,
// stops the start (the error names the variable and the tenant, never
// the key).
func httpAuth(o Options, log *slog.Logger) (api.Auth, error) {
	c := o.Config
	keys, tenants, err := authKeys(o, c) // reload.go
	if err != nil {
		return api.Auth{}, err
	}
	if !servesAPI(o) {
		return api.NewKeyAuth(nil, tenants, false), nil
	}
	if c.Server.Open {
		log.Warn("development mode (server.open): HTTP requests without an API key are served, as the tenant X-Sluice-Tenant names or the only tenant; do not expose this listener",
			"tenants", tenants, "api_keys", len(keys))
	}
	return api.NewKeyAuth(keys, tenants, c.Server.Open), nil
}

// addHTTP adds the HTTP API server and, with server.metrics, the metrics
// server to g. It returns the addresses bound. /metrics is never on the
// API listener: it names every tenant and its traffic, and the API
// listener is what callers reach.
func addHTTP(g *run.Group, o Options, apiHandler http.Handler, reg *prometheus.Registry, log *slog.Logger) (httpAddr, metricsAddr string, err error) {
	s := o.Config.Server
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	var tlsCfg *tls.Config
	if s.HTTPTLS.Enabled() {
		cert, err := tls.LoadX509KeyPair(s.HTTPTLS.Cert, s.HTTPTLS.Key)
		if err != nil {
			return "", "", fmt.Errorf("server.http_tls: %w", err)
		}
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	}
	var opened []net.Listener
	defer func() {
		if err != nil { // g will not run: nothing else closes them
			for _, ln := range opened {
				_ = ln.Close()
			}
		}
	}()
	serve := func(name, addr string, h http.Handler) (string, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return "", fmt.Errorf("listen %s %s: %w", name, addr, err)
		}
		opened = append(opened, ln)
		t := s.HTTPTimeouts
		srv := &http.Server{Handler: h, ReadHeaderTimeout: t.ReadHeader.D(), ReadTimeout: t.Read.D(),
			WriteTimeout: t.Write.D(), IdleTimeout: t.Idle.D(), ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
		if tlsCfg != nil {
			srv.TLSConfig = tlsCfg.Clone()
		}
		g.Add(func() error {
			var err error
			if tlsCfg != nil {
				err = srv.ServeTLS(ln, "", "")
			} else {
				err = srv.Serve(ln)
			}
			if !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		}, func(error) {
			sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
			defer c()
			_ = srv.Shutdown(sctx)
		})
		log.Info(name+" listening", "addr", ln.Addr().String(), "tls", tlsCfg != nil)
		return ln.Addr().String(), nil
	}
	if s.Metrics != "" && s.Metrics != "off" {
		mm := http.NewServeMux()
		mm.Handle("GET /metrics", metrics)
		if s.Pprof {
			mm.HandleFunc("GET /debug/pprof/", pprof.Index)
			mm.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
			mm.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
			mm.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
			mm.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
		}
		if metricsAddr, err = serve("metrics", s.Metrics, mm); err != nil {
			return "", "", fmt.Errorf("%w (server.metrics, --metrics: another address, or off)", err)
		}
	}
	if o.HTTP != "" {
		if httpAddr, err = serve("http", o.HTTP, api.WithRequestID(apiHandler)); err != nil {
			return "", "", err
		}
	}
	return httpAddr, metricsAddr, nil
}
