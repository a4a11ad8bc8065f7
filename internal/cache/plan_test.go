package cache

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

func planConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(`
providers:
  - name: sim
    base_url: http://127.0.0.1:1/v1
    api_key_env: SIM_KEY
    models:
      - {name: m1, rpm: 100, tpm: 100000}
      - {name: m2, rpm: 100, tpm: 100000}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
  - {name: globex, api_key_env: GLOBEX_KEY}
cache:
  models: {m2: 10m}
  shared_scopes: {docs: [acme]}
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func decide(t *testing.T, app *config.Config, tenant string, h http.Header, body string) *Plan {
	t.Helper()
	ask, err := AskFromHeader(h)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Decide(Request{App: app, Tenant: tenant, Ask: ask, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestDecide(t *testing.T) {
	t.Parallel()
	app := planConfig(t)
	const det = `{"model":"m1","temperature":0,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name        string
		h           http.Header
		body        string
		nilPlan     bool
		cacheable   bool
		read, write bool
		coalesce    bool
		ttl         time.Duration
	}{
		{name: "not asked", h: hdr(), body: det, nilPlan: true},
		{name: "max-age", h: hdr("Cache-Control", "max-age=60"), body: det, cacheable: true, read: true, write: true, coalesce: true, ttl: time.Minute},
		{name: "max-age capped", h: hdr("Cache-Control", "max-age=999999999"), body: det, cacheable: true, read: true, write: true, coalesce: true, ttl: config.DefaultCacheTTL},
		{name: "model config", h: hdr(), body: `{"model":"m2","temperature":0,"messages":[]}`, cacheable: true, read: true, write: true, coalesce: true, ttl: 10 * time.Minute},
		{name: "no temperature", h: hdr("Cache-Control", "max-age=60"), body: `{"model":"m1","messages":[]}`},
		{name: "temperature 0.5", h: hdr("Cache-Control", "max-age=60"), body: `{"model":"m1","temperature":0.5,"messages":[]}`},
		{name: "temperature null", h: hdr("Cache-Control", "max-age=60"), body: `{"model":"m1","temperature":null,"messages":[]}`},
		{name: "temperature 0.0", h: hdr("Cache-Control", "max-age=60"), body: `{"model":"m1","temperature":0.0,"messages":[]}`, cacheable: true, read: true, write: true, coalesce: true, ttl: time.Minute},
		{name: "seed", h: hdr("Cache-Control", "max-age=60"), body: `{"model":"m1","temperature":1,"seed":3,"messages":[]}`, cacheable: true, read: true, write: true, coalesce: true, ttl: time.Minute},
		{name: "force", h: hdr("Cache-Control", "max-age=60", "X-Sluice-Cache", "force"), body: `{"model":"m1","messages":[]}`, cacheable: true, read: true, write: true, coalesce: true, ttl: time.Minute},
		{name: "tools", h: hdr("Cache-Control", "max-age=60"), body: `{"model":"m1","temperature":0,"tools":[{"type":"function"}],"messages":[]}`},
		{name: "no-cache", h: hdr("Cache-Control", "max-age=60, no-cache"), body: det, cacheable: true, write: true, ttl: time.Minute},
		{name: "no-store", h: hdr("Cache-Control", "max-age=60", "Cache-Control", "no-store"), body: det, cacheable: true, read: true, coalesce: true, ttl: time.Minute},
		{name: "unknown model", h: hdr("Cache-Control", "max-age=60"), body: `{"model":"m9","temperature":0}`, nilPlan: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := decide(t, app, "acme", tc.h, tc.body)
			if tc.nilPlan {
				if p != nil {
					t.Fatalf("plan %+v, want none", p)
				}
				return
			}
			if p == nil {
				t.Fatal("no plan")
			}
			if p.Cacheable != tc.cacheable || p.Read != tc.read || p.Write != tc.write || (p.Coalesce != "") != tc.coalesce {
				t.Errorf("cacheable %v read %v write %v coalesce %q (why %q), want %v %v %v %v", p.Cacheable, p.Read, p.Write, p.Coalesce, p.Why, tc.cacheable, tc.read, tc.write, tc.coalesce)
			}
			if tc.cacheable && p.TTL != tc.ttl {
				t.Errorf("ttl %s, want %s", p.TTL, tc.ttl)
			}
		})
	}
}

// TestKey: what changes the answer changes the key; what does not, does
// not; another tenant never shares it unless a shared scope says so.
func TestKey(t *testing.T) {
	t.Parallel()
	app := planConfig(t)
	ask := hdr("Cache-Control", "max-age=60")
	key := func(tenant string, h http.Header, body string) string {
		p := decide(t, app, tenant, h, body)
		if p == nil || !p.Cacheable {
			t.Fatalf("%s: not cacheable", body)
		}
		return p.Key
	}
	base := key("acme", ask, `{"model":"m1","temperature":0,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)
	if !strings.HasPrefix(base, "t.acme.m1.") {
		t.Errorf("key %q, want t.acme.m1.<hash>", base)
	}
	same := []string{
		`{"messages":[{"content":"hi","role":"user"}],"max_tokens":10,"temperature":0,"model":"m1"}`,
		`{"model":"m1","temperature":0,"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m1","temperature":0,"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"user":"u1","metadata":{"a":"b"}}`,
	}
	for _, b := range same {
		if k := key("acme", ask, b); k != base {
			t.Errorf("%s: key %s, want %s", b, k, base)
		}
	}
	differ := []string{
		`{"model":"m1","temperature":0,"max_tokens":11,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m1","temperature":0,"max_tokens":10,"stop":["x"],"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m1","temperature":0,"max_tokens":10,"messages":[{"role":"user","content":"hi!"}]}`,
		`{"model":"m2","temperature":0,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m1","temperature":0,"seed":1,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
	}
	for _, b := range differ {
		if k := key("acme", ask, b); k == base {
			t.Errorf("%s: same key as the base request", b)
		}
	}
	body := `{"model":"m1","temperature":0,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	if k := key("globex", ask, body); k == base || !strings.HasPrefix(k, "t.globex.") {
		t.Errorf("globex's key %q: want its own", k)
	}
	if k := key("acme", hdr("Cache-Control", "max-age=60", "X-Sluice-Prompt-Version", "v2"), body); k == base {
		t.Error("a prompt version does not change the key")
	}
	if k := key("acme", hdr("Cache-Control", "max-age=60", "X-Sluice-Cache-Scope", "docs"), body); !strings.HasPrefix(k, "s.docs.m1.") {
		t.Errorf("shared scope key %q", k)
	}
	a, _ := AskFromHeader(hdr("Cache-Control", "max-age=60", "X-Sluice-Cache-Scope", "docs"))
	if _, err := Decide(Request{App: app, Tenant: "globex", Ask: a, Body: []byte(body)}); err == nil {
		t.Error("globex used a scope it is not in")
	}
	// A caller's own idempotency key decides what joins.
	p, _ := Decide(Request{App: app, Tenant: "acme", Ask: &job.CacheOptions{TTL: 60}, Body: []byte(body), IdempotencyKey: "mine"})
	if p.Coalesce != "" {
		t.Errorf("coalesce key %q with the caller's own idempotency key", p.Coalesce)
	}
}

func TestAskFromHeaderRefuses(t *testing.T) {
	t.Parallel()
	for _, h := range []http.Header{hdr("Cache-Control", "max-age=soon"), hdr("Cache-Control", "max-age=-1"), hdr("X-Sluice-Cache", "always")} {
		if _, err := AskFromHeader(h); err == nil {
			t.Errorf("%v: accepted", h)
		}
	}
}

func TestStorable(t *testing.T) {
	t.Parallel()
	u := &job.Usage{PromptTokens: 1, CompletionTokens: 1}
	for _, tc := range []struct {
		res  *job.Result
		want bool
	}{
		{&job.Result{Status: job.StatusSucceeded, Usage: u, Response: []byte(`{"choices":[{"finish_reason":"stop"}]}`)}, true},
		{&job.Result{Status: job.StatusSucceeded, Usage: u, Response: []byte(`{"choices":[{"finish_reason":"tool_calls"}]}`)}, true},
		{&job.Result{Status: job.StatusSucceeded, Usage: u, Response: []byte(`{"choices":[{"finish_reason":"length"}]}`)}, false},
		{&job.Result{Status: job.StatusSucceeded, Usage: u, Response: []byte(`{"choices":[{"finish_reason":"content_filter"}]}`)}, false},
		{&job.Result{Status: job.StatusSucceeded, Usage: u, Response: []byte(`{"choices":[{"finish_reason":"stop"},{"finish_reason":"length"}]}`)}, false},
		{&job.Result{Status: job.StatusSucceeded, Response: []byte(`{"choices":[{"finish_reason":"stop"}]}`)}, false},
		{&job.Result{Status: job.StatusInterrupted, Usage: u, Response: []byte(`{"choices":[{"finish_reason":null}]}`)}, false},
		{&job.Result{Status: job.StatusFailed, Usage: u}, false},
	} {
		if got := Storable(tc.res); got != tc.want {
			t.Errorf("%s %s: storable %v, want %v", tc.res.Status, tc.res.Response, got, tc.want)
		}
	}
}

func TestMayWrite(t *testing.T) {
	t.Parallel()
	app := planConfig(t)
	for _, tc := range []struct {
		tenant, key string
		want        bool
	}{
		{"acme", "t.acme.m1.abc", true},
		{"acme", "t.globex.m1.abc", false},
		{"acme", "s.docs.m1.abc", true},
		{"globex", "s.docs.m1.abc", false},
		{"acme", "t.acme.abc", false},
	} {
		if got := mayWrite(app, tc.tenant, &task.CacheTarget{Key: tc.key, TTL: time.Minute}); got != tc.want {
			t.Errorf("%s writing %s: %v, want %v", tc.tenant, tc.key, got, tc.want)
		}
	}
	if mayWrite(app, "acme", &task.CacheTarget{Key: "t.acme.m1.abc", TTL: 48 * time.Hour}) {
		t.Error("a TTL over cache.max_ttl was written")
	}
}
