package config_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
)

const liveBase = `server: {http: "127.0.0.1:8080"}
providers:
  - {name: p, base_url: "http://127.0.0.1:1/v1", models: [{name: m, rpm: 60}, {name: n}]}
tenants:
  - {name: a, api_key_env: A_KEY}
queues: {intake: {max_msgs: 1000}}
`

func mustParse(t *testing.T, data string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A reload may change tenants, providers, routes and retry; anything else
// is refused, naming the key.
func TestRestartNamesKeys(t *testing.T) {
	t.Parallel()
	old := mustParse(t, liveBase)
	for _, tc := range []struct {
		name, from, to string
		restart        []string
		changed        string // one of the changes, "" for none
	}{
		{"unchanged", "", "", nil, ""},
		{"a limit raised", "rpm: 60", "rpm: 600", nil, "providers[0].models[0].rpm"},
		{"a tenant added", "tenants:\n", "tenants:\n  - {name: b, api_key_env: B_KEY}\n", nil, "tenants"},
		{"the listener", "127.0.0.1:8080", "127.0.0.1:9090", []string{"server.http"}, "server.http"},
		{"a stream bound", "max_msgs: 1000", "max_msgs: 10", []string{"queues.intake.max_msgs"}, "queues.intake.max_msgs"},
	} {
		c := mustParse(t, strings.Replace(liveBase, tc.from, tc.to, 1))
		got := c.Restart(old)
		if len(got) == 0 && len(tc.restart) > 0 || len(tc.restart) == 0 && len(got) > 0 || len(tc.restart) > 0 && !slices.Contains(got, tc.restart[0]) {
			t.Errorf("%s: Restart = %q, want %q (with what its defaults derive)", tc.name, got, tc.restart)
		}
		got = c.Changes(old)
		if tc.changed == "" && len(got) != 0 || tc.changed != "" && !slices.Contains(got, tc.changed) {
			t.Errorf("%s: Changes = %q, want %q among them", tc.name, got, tc.changed)
		}
	}
	err := config.RestartError([]string{"server.http"})
	if !strings.Contains(err.Error(), "server.http cannot change while running") {
		t.Errorf("RestartError = %q, want it to name server.http", err)
	}
}

func TestLiveStoreWakesNext(t *testing.T) {
	t.Parallel()
	a, b := mustParse(t, liveBase), mustParse(t, liveBase)
	l := config.NewLive(a)
	next := l.Next()
	select {
	case <-next:
		t.Fatal("Next closed before any Store")
	default:
	}
	l.Store(b)
	<-next // closed, or the test times out
	if l.Load() != b {
		t.Error("Load after Store is not the stored configuration")
	}
}

// api_keys: each entry by env or file, an RFC 3339 expiry, models that
// exist; problems named by key.
func TestAPIKeysChecked(t *testing.T) {
	t.Parallel()
	_, ps := config.Check([]byte(strings.Replace(liveBase, "{name: a, api_key_env: A_KEY}",
		`{name: a, api_keys: [{env: K1, expires: "tomorrow"}, {env: K2, file: /x}, {env: K3, models: [m, nope]}]}`, 1)), nil)
	want := map[string]bool{"tenants[0].api_keys[0].expires": true, "tenants[0].api_keys[1].env": true, "tenants[0].api_keys[2].models[1]": true}
	for _, p := range ps {
		if !want[p.Key] {
			t.Errorf("unexpected problem %v", p)
		}
		delete(want, p.Key)
	}
	for k := range want {
		t.Errorf("no problem on %s; got %v", k, ps)
	}
}

// Credentials resolves every key of every tenant, from variables and
// files; an expired key whose variable is gone is dropped, an unexpired
// one missing is an error naming it; no error shows a key.
func TestCredentials(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte("file-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	c := mustParse(t, strings.Replace(liveBase, "{name: a, api_key_env: A_KEY}", `{name: a, api_key_env: A_KEY, api_keys: [
      {env: OLD, expires: "2026-12-02T00:00:00Z"},
      {env: GONE, expires: "2026-12-01T00:00:00Z"},
      {file: `+file+`, models: [m]}]}`, 1))
	env := map[string]string{"A_KEY": "a-key", "OLD": "old-key"}
	creds, err := c.Credentials(func(k string) string { return env[k] }, now)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]config.Credential{}
	for _, k := range creds {
		got[k.Key] = k
	}
	if len(got) != 3 || got["old-key"].Expires.IsZero() || !slices.Equal(got["file-key"].Models, []string{"m"}) || got["a-key"].Tenant != "a" {
		t.Errorf("Credentials = %+v, want a-key, old-key (with its expiry) and file-key (models [m])", creds)
	}
	env["A_KEY"] = "old-key" // held twice
	delete(env, "OLD")
	c.Tenants[0].APIKeys[0].Expires = "2027-01-01T00:00:00Z" // not expired, and unset
	c.Tenants[0].APIKeys[0].Env = "OLD"
	env["A_KEY"] = "file-key"
	_, err = c.Credentials(func(k string) string { return env[k] }, now)
	if err == nil || !strings.Contains(err.Error(), "tenants[0].api_keys[0].env") || !strings.Contains(err.Error(), "OLD is unset") ||
		!strings.Contains(err.Error(), "tenants[0].api_keys[2].file") || strings.Contains(err.Error(), "file-key") {
		t.Errorf("Credentials error = %v, want OLD unset and the file's key held twice, named by key path, no key shown", err)
	}
}
