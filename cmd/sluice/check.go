package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/embedded"
	"github.com/sluice-dev/sluice/internal/natsauth"
	"github.com/sluice-dev/sluice/internal/tracing"
)

// errNoConfig is what `sluice up` says when it is given no configuration: a
// node without providers and tenants would start and then refuse every job.
func errNoConfig() error {
	var b strings.Builder
	b.WriteString("up: no configuration (--config FILE or SLUICE_CONFIG). To start:\n")
	if _, err := os.Stat("sluice.yaml"); err == nil {
		b.WriteString("  sluice up --config sluice.yaml    run with the sluice.yaml in this directory\n")
	} else {
		b.WriteString("  sluice init                       write a commented sluice.yaml (the provider simulator, one tenant)\n")
		b.WriteString("  sluice up --config sluice.yaml    run with it\n")
	}
	b.WriteString("  sluice demo                       or watch the whole mesh work for 100 s, nothing to configure")
	return errors.New(b.String())
}

// loadConfig loads the file `sluice up` runs with. With check, a file with
// problems still gives what could be decoded, so every other check runs too,
// and the problems, the environment's included (key variables unset).
func loadConfig(path string, check bool, getenv func(string) string) (*config.Config, config.Problems, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		_, err := config.Load(path) // its message
		return nil, nil, "", err
	}
	if !check {
		c, err := config.Parse(data)
		if err != nil {
			return nil, nil, "", fmt.Errorf("%s: %w", path, err)
		}
		return c, nil, config.Hash(data), nil
	}
	c, ps := config.Check(data, getenv)
	if _, err := tracing.FromEnv(getenv); err != nil {
		ps = append(ps, config.Problem{Msg: err.Error()}) // it names the OTEL_* variable
	}
	return c, ps, config.Hash(data), nil
}

// reportCheck finishes `sluice up --check`: it adds what only the resolved
// settings show (the data directory) to the problems, and prints either all
// of them or a summary of what `sluice up` would run.
func reportCheck(ctx context.Context, w io.Writer, path string, c *config.Config, ps config.Problems, services []string, getenv func(string) string, doProbe bool) error {
	s := c.Server
	ps = append(ps, startProblems(c, services)...)
	if len(ps) > 0 {
		return fmt.Errorf("%s: %w", path, ps)
	}
	fmt.Fprintf(w, "%s: ok\n", path)
	for _, warn := range baseURLWarnings(c) { // probe.go
		fmt.Fprintf(w, "  warning   %s\n", warn)
	}
	for _, p := range c.Providers {
		var models []string
		for _, m := range p.Models {
			day := ""
			if m.HasDayQuota() {
				day = fmt.Sprintf(", %s rpd, %s tpd", limit(m.RPD), limit(m.TPD))
			}
			models = append(models, fmt.Sprintf("%s (%s rpm, %s tpm%s, %d concurrent)", m.Name, limit(m.RPM), limit(m.TPM), day, m.MaxConcurrency))
		}
		fmt.Fprintf(w, "  provider  %s %s: %s\n", p.Name, p.BaseURL, strings.Join(models, ", "))
	}
	for _, t := range c.Tenants {
		key := "no key"
		if t.APIKeyEnv != "" {
			key = "key from $" + t.APIKeyEnv
		}
		fmt.Fprintf(w, "  tenant    %s (%s, weight %d)\n", t.Name, key, t.Weight)
	}
	if len(c.Routes) > 0 {
		fmt.Fprintf(w, "  routes    %d\n", len(c.Routes))
	}
	if s.NATSURL == "" {
		fmt.Fprintf(w, "  nats      embedded, listening on %s, store %s\n", s.NATSListen, filepath.Join(s.Data, "jetstream"))
		if s.NATSCluster != "" {
			fmt.Fprintf(w, "  cluster   node %s, routes on %s, peers %s (%d replicas)\n", s.NATSName, s.NATSCluster, natsauth.RedactURL(s.NATSRoutes), max(s.Replicas, 1))
		}
	} else {
		fmt.Fprintf(w, "  nats      %s (%d replicas)\n", natsauth.RedactURL(s.NATSURL), max(s.Replicas, 1))
	}
	fmt.Fprintf(w, "  http      %s\n", s.HTTP)
	if s.Metrics == "" || s.Metrics == "off" {
		fmt.Fprintf(w, "  metrics   off\n")
	} else {
		fmt.Fprintf(w, "  metrics   %s (/metrics, apart from the API)\n", s.Metrics)
	}
	fmt.Fprintf(w, "  services  %s\n", strings.Join(services, ","))
	if doProbe && !probe(ctx, w, c, getenv) {
		return fmt.Errorf("%s: a provider probe failed (see above)", path)
	}
	return nil
}

// startProblems are what `sluice up` would refuse at start that the file
// alone does not show: the resolved addresses, the data directory, and an
// HTTP API without a tenant key.
func startProblems(c *config.Config, services []string) config.Problems {
	var ps config.Problems
	s := c.Server
	addr := func(key, v string) {
		if v == "" || v == "off" {
			return
		}
		host, port, err := net.SplitHostPort(v)
		n, perr := strconv.Atoi(port)
		switch {
		case err != nil || strings.ContainsAny(host, "/?#@"):
			ps = append(ps, config.Problem{Key: key, Msg: fmt.Sprintf("%q: want HOST:PORT", v)})
		case perr != nil || n < 0 || n > 65535:
			ps = append(ps, config.Problem{Key: key, Msg: fmt.Sprintf("%q: the port must be a number from 0 to 65535", v)})
		}
	}
	addr("server.http", s.HTTP)
	addr("server.metrics", s.Metrics)
	if s.NATSURL == "" {
		for _, a := range []struct{ key, v, what string }{{"server.nats_listen", s.NATSListen, "listen"}, {"server.nats_cluster", s.NATSCluster, "cluster"}} {
			if a.v == "" {
				continue
			}
			if err := embedded.CheckAddr(a.v, a.what); err != nil {
				ps = append(ps, config.Problem{Key: a.key, Msg: err.Error()})
			}
		}
		if err := embedded.CheckStoreDir(filepath.Join(s.Data, "jetstream")); err != nil {
			ps = append(ps, config.Problem{Key: "server.data", Msg: err.Error()})
		}
		if _, err := natsauth.LoadSecrets(s.Data); s.NATSCluster != "" && natsauth.AuthOn(c) && err != nil {
			ps = append(ps, config.Problem{Key: "server.nats_cluster", Msg: fmt.Sprintf("a cluster node with NATS authentication needs %s, the same on every node (sluice nats-auth --data DIR > /dev/null, then copy it): %v",
				natsauth.SecretsPath(s.Data), err)})
		}
	}
	if t := s.HTTPTLS; t.Enabled() {
		if _, err := tls.LoadX509KeyPair(t.Cert, t.Key); err != nil {
			ps = append(ps, config.Problem{Key: "server.http_tls", Msg: err.Error()})
		}
	}
	api := s.HTTP != "off" && s.HTTP != "" && (slices.Contains(services, "ingest") || slices.Contains(services, "result"))
	keyed := slices.ContainsFunc(c.Tenants, func(t config.Tenant) bool { return t.APIKeyEnv != "" || len(t.APIKeys) > 0 })
	if api && !s.Open && !keyed {
		ps = append(ps, config.Problem{Key: "tenants", Msg: "no tenant has an API key, so the HTTP API would be open to anyone and `sluice up` refuses to start: " +
			"give a tenant api_key_env (and export it), or run in development mode (server.open: true, --open)"})
	}
	return ps
}

func limit(n int) string {
	if n == 0 {
		return "no"
	}
	return fmt.Sprint(n)
}
