package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/examples"
)

// up --check refuses what up refuses at start (each named by key), warns
// on a base_url that misses /v1, and with --probe calls each provider.
func TestUpCheckRunsStartChecks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sim, _ := examples.Config("sim")
	env := map[string]string{"SLUICE_DEMO_KEY": "k"}
	getenv := func(k string) string { return env[k] }
	check := func(t *testing.T, yaml string, flags ...string) (string, error) {
		t.Helper()
		dir := t.TempDir()
		path := filepath.Join(dir, "sluice.yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		err := run(ctx, append([]string{"up", "--check", "--config", path, "--data", filepath.Join(dir, "data")}, flags...), getenv, &out, &errOut)
		return out.String(), err
	}
	for _, tc := range []struct {
		name, yaml string
		flags      []string
		want       string
	}{
		{"no tenant key", strings.Replace(string(sim), "api_key_env: SLUICE_DEMO_KEY", "# no key", 1), nil, "tenants: no tenant has an API key"},
		{"http port", string(sim), []string{"--http", "127.0.0.1:99999"}, `server.http: "127.0.0.1:99999": the port must be a number from 0 to 65535`},
		{"nats listen with a path", string(sim), []string{"--nats-listen", "127.0.0.1:4222/x"}, "server.nats_listen: nats listen address"},
		{"nats listen as a URL", string(sim), []string{"--nats-listen", "nats://127.0.0.1:4222"}, "server.nats_listen: nats listen address"},
	} {
		if _, err := check(t, tc.yaml, tc.flags...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: up --check: got %v, want it to contain %q", tc.name, err, tc.want)
		}
	}
	out, err := check(t, strings.Replace(string(sim), "127.0.0.1:8090/v1", "127.0.0.1:8090", 1))
	if err != nil || !strings.Contains(out, `warning   providers[0].base_url: "http://127.0.0.1:8090" does not end in /v1`) {
		t.Errorf("base_url without /v1: got %q, %v, want ok with a warning naming the key", out, err)
	}

	t.Run("probe", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/models" || r.Header.Get("Authorization") != "Bearer sim-key" {
				http.Error(w, `{"error":{"message":"bad key"}}`, http.StatusUnauthorized)
				return
			}
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"gpt-4o-mini"}]}`))
		}))
		defer srv.Close()
		yaml := strings.Replace(string(sim), "http://127.0.0.1:8090/v1", srv.URL+"/v1", 1)
		yaml = strings.Replace(yaml, "base_url:", "api_key_env: SIM_KEY\n    base_url:", 1)
		env := map[string]string{"SLUICE_DEMO_KEY": "k", "SIM_KEY": "sim-key"}
		getenv := func(k string) string { return env[k] }
		dir := t.TempDir()
		path := filepath.Join(dir, "sluice.yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"up", "--check", "--probe", "--config", path, "--data", filepath.Join(dir, "data")}
		var out, errOut bytes.Buffer
		if err := run(ctx, args, getenv, &out, &errOut); err != nil || !strings.Contains(out.String(), "probe     providers[0] sim / gpt-4o-mini: ok") {
			t.Errorf("probe with the right key: got %q, %v, want the deployment ok", out.String(), err)
		}
		env["SIM_KEY"] = "wrong"
		out.Reset()
		if err := run(ctx, args, getenv, &out, &errOut); err == nil || !strings.Contains(out.String(), "401 Unauthorized: the provider refused the key in SIM_KEY") {
			t.Errorf("probe with a wrong key: got %q, %v, want the refusal named", out.String(), err)
		}
	})
}
