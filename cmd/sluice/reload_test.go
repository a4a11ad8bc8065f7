package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// reloadConfig is the fleet's configuration: version 1 has tenant acme
// with one key and a model limited to 2,000 tokens per minute; version 2
// rotates acme's key (the old one expiring at oldExpires, a new one from
// ACME_KEY2), adds tenant globex and raises the limit to 1,000,000.
func reloadConfig(simURL string, v2 bool, oldExpires time.Time, extra string) string {
	tpm, tenants := 2000, "  - {name: acme, api_key_env: ACME_KEY}\n"
	if v2 {
		tpm = 1_000_000
		tenants = fmt.Sprintf("  - name: acme\n    api_keys: [{env: ACME_KEY, expires: %q}, {env: ACME_KEY2}]\n  - {name: globex, api_key_env: GLOBEX_KEY}\n",
			oldExpires.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf(`server: {operator_key_env: OPERATOR_KEY%s}
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: m, rpm: 100000, tpm: %d, max_concurrency: 32}
tenants:
%s`, extra, simURL, tpm, tenants)
}

// reloadFleet is three `sluice up` processes on one NATS server, each
// with its own configuration file: front (ingest, result, HTTP),
// admission and executor.
type reloadFleet struct {
	files                      []string // front, admission, executor
	front, admission, executor *child
	natsURL                    string
	nc                         *nats.Conn
}

func (f *reloadFleet) write(t *testing.T, cfg string) {
	t.Helper()
	for _, p := range f.files {
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// post submits an async job with key; it returns the status and the body.
func (f *reloadFleet) post(t *testing.T, key string, body []byte) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.front.HTTP+"/v1/jobs", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// submit posts a job that must be accepted and returns its id.
func (f *reloadFleet) submit(t *testing.T, key, tenant string, words int) string {
	t.Helper()
	env, _ := json.Marshal(map[string]any{"tenant": tenant, "request": json.RawMessage(systest.ChatBody("m", words, 50))})
	code, body := f.post(t, key, env)
	if code != http.StatusAccepted {
		t.Fatalf("submit as %s: %d %s, want 202", tenant, code, body)
	}
	var out struct{ ID string }
	if err := json.Unmarshal([]byte(body), &out); err != nil || out.ID == "" {
		t.Fatalf("submit as %s: %s", tenant, body)
	}
	return out.ID
}

func logHas(t *testing.T, c *child, wants ...string) error {
	t.Helper()
	data, _ := os.ReadFile(c.log)
	for _, w := range wants {
		if !strings.Contains(string(data), w) {
			return fmt.Errorf("%s: no %q in its log yet", c.log, w)
		}
	}
	return nil
}

// TestReloadFleet reloads a fleet of separate processes, each re-reading
// its own file: SIGHUP to one process adds a tenant, rotates a key (the
// old one refused once expired, the new one accepted) and raises a limit
// (a job above the old one is accepted and placed) everywhere, while the
// jobs submitted before and during it all complete exactly once; SIGHUP
// never ends a process. `sluice reload` then reports a refused reload from
// every process (a changed listen address; an invalid value), the old
// configuration keeps running; POST /admin/reload needs the operator key;
// SIGTERM is logged.
func TestReloadFleet(t *testing.T) {
	bin := sluiceBinary(t)
	seen := &systest.Judged{}
	_, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "m", RPM: 100_000, TPM: 10_000_000}},
		TTFT: 200 * time.Millisecond, APIKeys: []string{"sim-secret"}, OnArrival: seen.Add})
	ns := natstest.Server(t)
	dir := t.TempDir()
	f := &reloadFleet{natsURL: ns.ClientURL()}
	for _, name := range []string{"front", "admission", "executor"} {
		f.files = append(f.files, filepath.Join(dir, name+".yaml"))
	}
	f.write(t, reloadConfig(simURL, false, time.Time{}, ""))
	env := map[string]string{"ACME_KEY2": "acme-key-2", "OPERATOR_KEY": "operator-secret"}
	for k, v := range systest.Env {
		env[k] = v
	}
	start := func(i int, services string) *child {
		return startChild(t, bin, []string{"--config", f.files[i], "--nats-url", f.natsURL, "--http", "127.0.0.1:0",
			"--services", services, "--log-level", "info"}, env)
	}
	f.front, f.admission, f.executor = start(0, "ingest,result"), start(1, "admission"), start(2, "executor")
	f.nc, _ = systest.Connect(t, f.natsURL)
	results := map[string]int{}
	var mu sync.Mutex
	sub, err := f.nc.Subscribe(job.ResultPrefix+">", func(m *nats.Msg) {
		var r job.Result
		if json.Unmarshal(m.Data, &r) == nil && r.JobID != "" {
			mu.Lock()
			results[r.JobID]++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	// Before: acme's one key; a job above 2,000 tokens is refused.
	big := 2500 // words: about 2,900 tokens with its 50 output tokens
	if code, body := f.post(t, "acme-key", mustJSON(map[string]any{"tenant": "acme", "request": json.RawMessage(systest.ChatBody("m", big, 50))})); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "above the model's limit") {
		t.Fatalf("a job above tpm before the reload: %d %s, want 413 naming the limit", code, body)
	}
	var ids []string
	for range 5 {
		ids = append(ids, f.submit(t, "acme-key", "acme", 20))
	}

	// Reload by SIGHUP to the front, with jobs submitted meanwhile.
	oldExpires := time.Now().Add(6 * time.Second)
	f.write(t, reloadConfig(simURL, true, oldExpires, ""))
	if err := f.front.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		ids = append(ids, f.submit(t, "acme-key", "acme", 20)) // the old key is good until it expires
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		if code, body := f.post(t, "globex-key", mustJSON(map[string]any{"tenant": "globex", "request": json.RawMessage(systest.ChatBody("m", 20, 50))})); code != http.StatusAccepted {
			return fmt.Errorf("globex after the reload: %d %s", code, body)
		} else {
			var out struct{ ID string }
			_ = json.Unmarshal([]byte(body), &out)
			ids = append(ids, out.ID)
		}
		return nil
	})
	ids = append(ids, f.submit(t, "acme-key-2", "acme", big)) // above the old limit: placed under the new one
	for _, c := range []*child{f.admission, f.executor} {
		natstest.Eventually(t, 30*time.Second, func() error { return logHas(t, c, `"msg":"configuration reloaded"`, "providers[0].models[0].tpm") })
	}
	if err := logHas(t, f.front, `"msg":"reloading configuration","signal":"SIGHUP"`, `"msg":"configuration reloaded"`); err != nil {
		t.Error(err)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		code, body := f.post(t, "acme-key", mustJSON(map[string]any{"tenant": "acme", "request": json.RawMessage(systest.ChatBody("m", 20, 50))}))
		if code != http.StatusUnauthorized || !strings.Contains(body, "expired at "+oldExpires.UTC().Format(time.RFC3339)) || strings.Contains(body, "acme-key") {
			return fmt.Errorf("old key after its expiry: %d %s, want 401 saying it expired, without the key", code, body)
		}
		return nil
	})
	ids = append(ids, f.submit(t, "acme-key-2", "acme", 20))

	// Every job completes exactly once, and the provider answered each once.
	natstest.Eventually(t, 90*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if results[id] != 1 {
				return fmt.Errorf("job %s: %d results so far, want 1", id, results[id])
			}
		}
		return nil
	})
	calls := map[string]int{}
	for _, a := range seen.All() {
		if a.Admitted {
			calls[a.JobID]++
		}
	}
	for _, id := range ids {
		if calls[id] != 1 {
			t.Errorf("job %s: the provider answered %d calls, want 1", id, calls[id])
		}
	}
	for _, c := range []*child{f.front, f.admission, f.executor} {
		if err := c.cmd.Process.Signal(syscall.Signal(0)); err != nil {
			t.Errorf("a process ended after SIGHUP: %v", err)
		}
	}

	f.refusals(t, simURL, oldExpires)
	f.admin(t, simURL, oldExpires)

	if err := f.executor.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 30*time.Second, func() error { return logHas(t, f.executor, `"msg":"shutting down","signal":"SIGTERM"`) })
}

// refusals: a reload the processes cannot apply is refused by each, which
// `sluice reload` reports, and the old configuration keeps running.
func (f *reloadFleet) refusals(t *testing.T, simURL string, oldExpires time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct{ name, cfg, want string }{
		{"listen address", reloadConfig(simURL, true, oldExpires, `, nats_listen: "127.0.0.1:4999"`), "server.nats_listen cannot change while running"},
		{"invalid value", strings.Replace(reloadConfig(simURL, true, oldExpires, ""), "rpm: 100000", "rpm: -5", 1), "providers[0].models[0].rpm: must be >= 0"},
	} {
		f.write(t, strings.Replace(tc.cfg, "{name: globex, api_key_env: GLOBEX_KEY}", "{name: initech, api_key_env: INITECH_KEY}", 1))
		var out, errOut bytes.Buffer
		err := run(ctx, []string{"reload", "--nats-url", f.natsURL, "--expect", "3", "--wait", "20s"}, func(string) string { return "" }, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), "3 of 3 processes kept their old configuration") || strings.Count(out.String(), tc.want) != 3 {
			t.Errorf("%s: sluice reload: %v\n%s\nwant 3 processes refusing with %q", tc.name, err, out.String(), tc.want)
		}
		if code, body := f.post(t, "globex-key", mustJSON(map[string]any{"tenant": "globex", "request": json.RawMessage(systest.ChatBody("m", 20, 50))})); code != http.StatusAccepted {
			t.Errorf("%s: globex after a refused reload: %d %s, want the old configuration still running", tc.name, code, body)
		}
		if code, _ := f.post(t, "initech-key", mustJSON(map[string]any{"tenant": "initech", "request": json.RawMessage(systest.ChatBody("m", 20, 50))})); code != http.StatusUnauthorized {
			t.Errorf("%s: initech after a refused reload: %d, want 401 (not applied)", tc.name, code)
		}
	}
}

// admin: POST /admin/reload needs the operator key; with it, the front
// reloads and the fleet follows.
func (f *reloadFleet) admin(t *testing.T, simURL string, oldExpires time.Time) {
	t.Helper()
	f.write(t, strings.Replace(reloadConfig(simURL, true, oldExpires, ""), "  - {name: globex", "  - {name: initech, api_key_env: INITECH_KEY}\n  - {name: globex", 1))
	post := func(key string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, f.front.HTTP+"/admin/reload", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	if code, body := post("acme-key-2"); code != http.StatusUnauthorized {
		t.Errorf("POST /admin/reload with a tenant's key: %d %s, want 401", code, body)
	}
	if code, body := post("operator-secret"); code != http.StatusOK || !strings.Contains(body, `"applied":true`) {
		t.Errorf("POST /admin/reload with the operator key: %d %s, want 200 applied", code, body)
	}
	if code, body := f.post(t, "initech-key", mustJSON(map[string]any{"tenant": "initech", "request": json.RawMessage(systest.ChatBody("m", 20, 50))})); code != http.StatusAccepted {
		t.Errorf("initech after POST /admin/reload: %d %s, want 202", code, body)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		data, _ := os.ReadFile(f.admission.log)
		if n := strings.Count(string(data), `"msg":"configuration reloaded"`); n != 2 {
			return fmt.Errorf("admission: %d reloads applied, want 2 (SIGHUP's, then POST /admin/reload's)", n)
		}
		return nil
	})
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
