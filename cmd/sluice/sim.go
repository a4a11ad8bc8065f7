package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

func runSim(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim", stderr)
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve the OpenAI-compatible API on")
	models := fs.String("models", "gpt-4o-mini=500/200000", "models and limits: name=RPM/TPM[,name=RPM/TPM...] (0 = unlimited)")
	burst := fs.Float64("burst-fraction", sim.DefaultBurstFraction, "per-second cap as a fraction of each per-minute limit")
	ttft := fs.Duration("ttft", 200*time.Millisecond, "latency before the first token")
	perToken := fs.Duration("per-token", 2*time.Millisecond, "latency per output token")
	apiKey := fs.String("api-key", "", "require this bearer key (default: any)")
	seed := fs.Int64("seed", 1, "fault injection seed")
	f500 := fs.Float64("fault-500", 0, "fraction of admitted requests answered 500")
	f502 := fs.Float64("fault-502", 0, "fraction answered 502")
	f503 := fs.Float64("fault-503", 0, "fraction answered 503 server_is_overloaded")
	fReset := fs.Float64("fault-reset", 0, "fraction whose connection is reset before any response")
	fHang := fs.Float64("fault-hang", 0, "fraction that never get an answer")
	quota := fs.String("quota-models", "", "comma-separated models that answer 429 insufficient_quota")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	ml, err := parseModels(*models)
	if err != nil {
		return fmt.Errorf("--models: %w", err)
	}
	cfg := sim.Config{Models: ml, BurstFraction: *burst, TTFT: *ttft, PerToken: *perToken,
		Faults: sim.Faults{Seed: *seed, Rate500: *f500, Rate502: *f502, Rate503: *f503, RateReset: *fReset, RateHang: *fHang}}
	if *apiKey != "" {
		cfg.APIKeys = []string{*apiKey}
	}
	if *quota != "" {
		cfg.Faults.QuotaModels = strings.Split(*quota, ",")
	}
	s, err := sim.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "sluice sim: OpenAI-compatible API on http://%s/v1 (stats: GET /stats)\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return nil
	case err := <-errc:
		return err
	}
}

// parseModels reads "name=RPM/TPM,name=RPM/TPM".
func parseModels(s string) ([]sim.ModelLimits, error) {
	var out []sim.ModelLimits
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, lim, ok := strings.Cut(part, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want name=RPM/TPM", part)
		}
		rs, ts, ok := strings.Cut(lim, "/")
		if !ok {
			return nil, fmt.Errorf("%q: want name=RPM/TPM", part)
		}
		rpm, err1 := strconv.Atoi(rs)
		tpm, err2 := strconv.Atoi(ts)
		if err := errors.Join(err1, err2); err != nil || rpm < 0 || tpm < 0 {
			return nil, fmt.Errorf("%q: RPM and TPM must be non-negative integers", part)
		}
		out = append(out, sim.ModelLimits{Name: name, RPM: rpm, TPM: tpm})
	}
	if len(out) == 0 {
		return nil, errors.New("no models")
	}
	return out, nil
}
