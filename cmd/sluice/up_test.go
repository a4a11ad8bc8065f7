package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestUpRefusesToStartOpen: `sluice up` that would serve the API with a
// tenant's key missing, with no keys at all, or with one key for two
// tenants does not start, and says why without showing a key.
func TestUpRefusesToStartOpen(t *testing.T) {
	t.Parallel()
	const provider = `
providers:
  - name: sim
    base_url: http://127.0.0.1:1/v1
    models: [{name: gpt-4o-mini}]
`
	for _, tc := range []struct {
		name, tenants string
		env           map[string]string
		args          []string
		want          []string
	}{
		{"unset key variable", "tenants:\n  - {name: acme, api_key_env: ACME_KEY}\n  - {name: globex, api_key_env: GLOBEX_KEY}\n",
			map[string]string{"GLOBEX_KEY": "globex-key"}, nil, []string{"ACME_KEY", "acme", "unset or empty"}},
		{"blank key variable", "tenants:\n  - {name: acme, api_key_env: ACME_KEY}\n",
			map[string]string{"ACME_KEY": "  "}, nil, []string{"ACME_KEY", "acme"}},
		{"unset key variable in open mode too", "tenants:\n  - {name: acme, api_key_env: ACME_KEY}\n",
			nil, []string{"--open"}, []string{"ACME_KEY", "acme"}},
		{"no keys", "tenants:\n  - {name: acme}\n", nil, nil, []string{"no tenant API keys", "server.open", "--open", "SLUICE_OPEN"}},
		{"no tenants", "", nil, nil, []string{"no tenant API keys", "server.open"}},
		{"SLUICE_OPEN=0 is not open", "", map[string]string{"SLUICE_OPEN": "0"}, nil, []string{"no tenant API keys"}},
		{"duplicate key", "tenants:\n  - {name: acme, api_key_env: ACME_KEY}\n  - {name: globex, api_key_env: GLOBEX_KEY}\n",
			map[string]string{"ACME_KEY": "shared-secret-key", "GLOBEX_KEY": "shared-secret-key"}, nil, []string{"GLOBEX_KEY", "globex", `"acme"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cfgPath := filepath.Join(dir, "sluice.yaml")
			if err := os.WriteFile(cfgPath, []byte(provider+tc.tenants), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var stderr systest.SyncBuffer
			args := append([]string{"up", "--config", cfgPath, "--data", filepath.Join(dir, "data"),
				"--nats-listen", "127.0.0.1:0", "--http", "127.0.0.1:0"}, tc.args...)
			err := run(ctx, args, func(k string) string { return tc.env[k] }, io.Discard, &stderr)
			if err == nil || ctx.Err() != nil {
				t.Fatalf("sluice up: got %v after %v, want a refusal to start", err, ctx.Err())
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("sluice up error %q: does not mention %q", err, want)
				}
			}
			if strings.Contains(err.Error()+stderr.String(), "shared-secret-key") {
				t.Errorf("sluice up printed the key: %q / %q", err, stderr.String())
			}
			if _, serr := os.Stat(filepath.Join(dir, "data")); serr == nil {
				t.Errorf("sluice up created its data directory before refusing; want nothing started")
			}
		})
	}
}

// TestOpenModeWithoutTenants: development mode, set explicitly, serves
// keyless requests as the tenant "default" when none is configured, and
// says so in the log; a key that is sent is still checked.
func TestOpenModeWithoutTenants(t *testing.T) {
	t.Parallel()
	simSrv, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 100, TPM: 100000}}})
	var stderr systest.SyncBuffer
	n := upInProcess(t, fmt.Sprintf(`
providers:
  - name: sim
    base_url: %s/v1
    models: [{name: gpt-4o-mini, rpm: 100, tpm: 100000}]
`, simURL), nil, []string{"--open"}, &stderr)
	systest.WaitReady(t, n.HTTP)
	if log := stderr.String(); !strings.Contains(log, `"level":"WARN"`) || !strings.Contains(log, "development mode") {
		t.Errorf("log of an open start: %q; want a warning about development mode", log)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithMaxRetries(0), option.WithHeaderDel("Authorization"))
	var resp *http.Response
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(8),
	}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatalf("keyless chat completion in open mode: %v", err)
	}
	id := resp.Header.Get("X-Sluice-Job-Id")
	got := systest.GetJob(t, ctx, n.HTTP, "", id, "")
	if got["tenant"] != "default" {
		t.Errorf("keyless job's tenant: got %v, want default", got["tenant"])
	}
	if st := simSrv.Stats(); st.Completed != 1 {
		t.Errorf("provider completed %d calls, want 1", st.Completed)
	}
	bad := openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey("wrong"), option.WithMaxRetries(0))
	_, err = bad.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Errorf("wrong key in open mode: got %v, want 401", err)
	}
}
