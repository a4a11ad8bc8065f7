package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/examples"
	"github.com/sluice-dev/sluice/internal/config"
)

func TestInitWritesTheExampleAndRefusesToOverwrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	noEnv := func(string) string { return "" }
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"init", path}, noEnv, &out, &errOut); err != nil {
		t.Fatalf("init: %v", err)
	}
	want, _ := examples.Config(examples.Default)
	if got, _ := os.ReadFile(path); !bytes.Equal(got, want) {
		t.Errorf("init wrote %d bytes, want the %d of examples/%s.yaml", len(got), len(want), examples.Default)
	}
	for _, w := range []string{"sluice sim", "export SLUICE_DEMO_KEY=", "sluice up --config " + path, "curl "} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("init output: got %q, want it to say %q", out.String(), w)
		}
	}

	if err := os.WriteFile(path, []byte("# mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(ctx, []string{"init", path}, noEnv, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "already exists") || !strings.Contains(err.Error(), "--force") {
		t.Errorf("init over an existing file: got %v, want a refusal naming --force", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "# mine\n" {
		t.Errorf("init without --force changed the file to %q", got)
	}

	// Flags after FILE count too.
	if err := run(ctx, []string{"init", path, "--force", "--example", "openai-anthropic"}, noEnv, &out, &errOut); err != nil {
		t.Fatalf("init --force --example openai-anthropic: %v", err)
	}
	want, _ = examples.Config("openai-anthropic")
	if got, _ := os.ReadFile(path); !bytes.Equal(got, want) {
		t.Errorf("init --force wrote %d bytes, want the %d of examples/openai-anthropic.yaml", len(got), len(want))
	}
	if err := run(ctx, []string{"init", "--example", "nope", path + ".2"}, noEnv, &out, &errOut); err == nil || !strings.Contains(err.Error(), "openai-anthropic") {
		t.Errorf("init --example nope: got %v, want an error listing the examples", err)
	}
}

// `sluice up` with no configuration stops at once and says how to start.
func TestUpWithoutConfigSaysHowToStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	err := run(ctx, []string{"up", "--data", t.TempDir()}, func(string) string { return "" }, &out, &errOut)
	if err == nil {
		t.Fatal("up without a config: got nil, want an error")
	}
	for _, w := range []string{"no configuration", "sluice init", "sluice up --config sluice.yaml", "sluice demo"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("up without a config: got %q, want it to say %q", err, w)
		}
	}
}

func TestUpCheck(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	sim, _ := examples.Config("sim")
	if err := os.WriteFile(path, sim, 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SLUICE_DEMO_KEY": "k"}
	getenv := func(k string) string { return env[k] }
	args := []string{"up", "--check", "--config", path, "--data", filepath.Join(dir, "data")}
	var out, errOut bytes.Buffer
	if err := run(ctx, args, getenv, &out, &errOut); err != nil {
		t.Fatalf("up --check on the example: %v", err)
	}
	for _, w := range []string{path + ": ok", "provider  sim http://127.0.0.1:8090/v1: gpt-4o-mini (500 rpm, 200000 tpm", "tenant    demo (key from $SLUICE_DEMO_KEY",
		"metrics   " + config.DefaultMetrics + " (/metrics, apart from the API)"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("up --check output: got %q, want it to contain %q", out.String(), w)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("up --check created the data directory (stat: %v); it must start nothing", err)
	}

	bad := strings.Replace(string(sim), "    models:\n", "    modles: []\n    models:\n", 1)
	bad = strings.Replace(bad, "rpm: 500 ", "rpm: -5 ", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	delete(env, "SLUICE_DEMO_KEY")
	out.Reset()
	err := run(ctx, args, getenv, &out, &errOut)
	if err == nil {
		t.Fatal("up --check on a bad config: got nil, want the problems")
	}
	for _, w := range []string{"3 problems", "providers[0].modles: unknown key; did you mean models? (line ", "providers[0].models[0].rpm: must be >= 0", "tenants[0].api_key_env: SLUICE_DEMO_KEY is not set; export SLUICE_DEMO_KEY="} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("up --check on a bad config: got %q, want it to contain %q", err, w)
		}
	}
	if out.Len() != 0 {
		t.Errorf("up --check on a bad config printed %q, want nothing but the error", out.String())
	}
}
