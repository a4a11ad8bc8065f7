package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// simModels are the models the simulator on addr serves for `up --sim`:
// those of every OpenAI-kind provider whose base_url points at addr, at
// their configured limits (upstream names, as the executor sends them).
func simModels(cfg *config.Config, addr string) ([]sim.ModelLimits, error) {
	var out []sim.ModelLimits
	for _, p := range cfg.Providers {
		u, err := url.Parse(p.BaseURL)
		if err != nil || u.Host != addr {
			continue
		}
		if p.Kind != "" && p.Kind != "openai" {
			return nil, fmt.Errorf("--sim %s: provider %q is kind %s; the simulator in `up` serves the OpenAI API (run `sluice sim --profile anthropic` apart)", addr, p.Name, p.Kind)
		}
		for _, m := range p.Models {
			name := m.Name
			if m.Upstream != "" {
				name = m.Upstream
			}
			out = append(out, sim.ModelLimits{Name: name, RPM: m.RPM, TPM: m.TPM, RPD: m.RPD, TPD: m.TPD})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--sim %s: no provider's base_url points there (want base_url: http://%s/v1)", addr, addr)
	}
	return out, nil
}

// startSim runs the provider simulator in this process for `up --sim ADDR`,
// so that a configuration written for `sluice sim` (examples/sim.yaml, the
// image's) runs alone: one process, one container. It listens before it
// returns (the first call finds it); stop shuts it down.
func startSim(addr string, cfg *config.Config, log *slog.Logger) (stop func(), err error) {
	models, err := simModels(cfg, addr)
	if err != nil {
		return nil, err
	}
	s, err := sim.New(sim.Config{Models: models, TTFT: 200 * time.Millisecond, PerToken: 2 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--sim: listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("provider simulator stopped", "err", err)
		}
	}()
	log.Info("provider simulator (up --sim) serving", "addr", ln.Addr().String(), "models", len(models))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
