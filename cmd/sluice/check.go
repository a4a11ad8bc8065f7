package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
func loadConfig(path string, check bool, getenv func(string) string) (*config.Config, config.Problems, error) {
	if !check {
		c, err := config.Load(path)
		return c, nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		_, err := config.Load(path) // the same message as without --check
		return nil, nil, err
	}
	c, ps := config.Check(data, getenv)
	if _, err := tracing.FromEnv(getenv); err != nil {
		ps = append(ps, config.Problem{Msg: err.Error()}) // it names the OTEL_* variable
	}
	return c, ps, nil
}

// reportCheck finishes `sluice up --check`: it adds what only the resolved
// settings show (the data directory) to the problems, and prints either all
// of them or a summary of what `sluice up` would run.
func reportCheck(w io.Writer, path string, c *config.Config, ps config.Problems, services []string) error {
	s := c.Server
	if s.NATSURL == "" {
		if err := embedded.CheckStoreDir(filepath.Join(s.Data, "jetstream")); err != nil {
			ps = append(ps, config.Problem{Key: "server.data", Msg: err.Error()})
		}
	}
	if len(ps) > 0 {
		return fmt.Errorf("%s: %w", path, ps)
	}
	fmt.Fprintf(w, "%s: ok\n", path)
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
	return nil
}

func limit(n int) string {
	if n == 0 {
		return "no"
	}
	return fmt.Sprint(n)
}
