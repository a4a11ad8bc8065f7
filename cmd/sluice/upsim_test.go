package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/version"
)

// `up --sim ADDR` serves the models of the providers whose base_url points
// at ADDR, at their limits and under their upstream names, and refuses an
// address no provider calls or a provider it cannot stand in for.
func TestSimModels(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(`
providers:
  - name: sim
    base_url: http://127.0.0.1:8090/v1
    models:
      - {name: gpt-4o-mini, rpm: 500, tpm: 200000}
      - {name: fast, upstream: gpt-4.1-nano, rpm: 60, tpm: 1000, rpd: 100}
  - name: other
    base_url: http://127.0.0.1:9999/v1
    models: [{name: elsewhere, rpm: 1, tpm: 1}]
  - name: claude
    kind: anthropic
    base_url: http://127.0.0.1:8091
    models: [{name: claude-3-5-haiku-latest, rpm: 50, itpm: 50000, otpm: 10000}]
tenants: [{name: acme}]
`))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := simModels(cfg, "127.0.0.1:8090")
	if err != nil || len(ms) != 2 || ms[0].Name != "gpt-4o-mini" || ms[0].RPM != 500 || ms[0].TPM != 200000 ||
		ms[1].Name != "gpt-4.1-nano" || ms[1].RPM != 60 || ms[1].RPD != 100 {
		t.Errorf("simModels(127.0.0.1:8090) = %+v, %v; want gpt-4o-mini 500/200000 and gpt-4.1-nano 60/1000/100", ms, err)
	}
	if _, err := simModels(cfg, "127.0.0.1:1234"); err == nil || !strings.Contains(err.Error(), "base_url") {
		t.Errorf("an address no provider calls: %v, want an error naming base_url", err)
	}
	if _, err := simModels(cfg, "127.0.0.1:8091"); err == nil || !strings.Contains(err.Error(), "anthropic") {
		t.Errorf("an anthropic provider: %v, want an error naming its kind", err)
	}
}

// `sluice version` prints the build as internal/version reads it.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, func(string) string { return "" }, &out, &out); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "sluice "+version.Get().String()+"\n"; got != want || !strings.Contains(got, "go1.") {
		t.Errorf("sluice version printed %q, want %q with the Go version", got, want)
	}
}
