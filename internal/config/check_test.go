package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/config"
)

// Check names every problem, by key path and line, in file order.
func TestCheckReportsEveryProblem(t *testing.T) {
	t.Parallel()
	data := `server:
  htp: 127.0.0.1:8080
providers:
  - name: openai
    base_url: https://api.openai.com/v1
    modles: []
    models:
      - name: a
        rpm: 10
      - name: b
        rpm: -5
        tpm: lots
  - name: second
    base_url: https://example.test/v1
    timeout: two minutes
    models: [{name: c}]
tenants:
  - name: acme
    weight: many
  - not-a-mapping
admission:
  slice: 1ms
`
	c, ps := config.Check([]byte(data), nil)
	if c == nil {
		t.Fatal("Check: got a nil config, want the decodable part")
	}
	want := []config.Problem{
		{Key: "server.htp", Line: 2, Msg: "unknown key; did you mean http?"},
		{Key: "providers[0].modles", Line: 6, Msg: "unknown key; did you mean models?"},
		{Key: "providers[0].models[1].rpm", Line: 11, Msg: "must be >= 0 (0 = no limit), got -5"},
		{Key: "providers[0].models[1].tpm", Line: 12, Msg: `must be a whole number, got "lots"`},
		{Key: "providers[1].timeout", Line: 15, Msg: `"two minutes" is not a duration (like 500ms, 8s, 5m)`},
		{Key: "tenants[0].weight", Line: 19, Msg: `must be a whole number, got "many"`},
		{Key: "tenants[1]", Line: 20, Msg: `must be a mapping of keys (name, api_key_env, api_keys, weight, rpm, tpm, rpd, tpd, max_concurrency, spend), got "not-a-mapping"`},
		{Key: "admission.slice", Line: 22, Msg: "must be between 10ms and 5s, got 1ms"},
	}
	if len(ps) != len(want) {
		t.Fatalf("Check: got %d problems, want %d:\n%v", len(ps), len(want), ps)
	}
	for i := range want {
		if ps[i] != want[i] {
			t.Errorf("problem %d: got %+v, want %+v", i, ps[i], want[i])
		}
	}
	if _, err := config.Parse([]byte(data)); !errors.As(err, new(config.Problems)) || !strings.HasPrefix(err.Error(), "config: 8 problems:\n  server.htp: ") {
		t.Errorf("Parse: got %v, want config.Problems listing all 8", err)
	}
}

func TestCheckDuplicateKey(t *testing.T) {
	t.Parallel()
	_, ps := config.Check([]byte("limits:\n  max_tokens: 2000\n  max_tokens: 3000\n"), nil)
	if len(ps) != 1 || ps[0].Key != "limits.max_tokens" || ps[0].Line != 3 || !strings.Contains(ps[0].Msg, "first on line 2") {
		t.Errorf("Check: got %v, want one problem at limits.max_tokens line 3 naming line 2", ps)
	}
}

func TestCheckSyntaxError(t *testing.T) {
	t.Parallel()
	_, ps := config.Check([]byte("providers:\n  - name: a\n   base_url: x\n"), nil)
	if len(ps) != 1 || ps[0].Line == 0 || !strings.HasPrefix(ps[0].Msg, "not valid YAML: ") {
		t.Errorf("Check: got %v, want one YAML syntax problem with its line", ps)
	}
}

// With getenv, every key variable the file names must be set.
func TestCheckEnvironment(t *testing.T) {
	t.Parallel()
	data := []byte(readmeExample)
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	_, ps := config.Check(data, getenv)
	if got, want := len(ps), 2; got != want {
		t.Fatalf("Check with nothing set: got %d problems, want %d: %v", got, want, ps)
	}
	if p := ps[0]; p.Key != "providers[0].api_key_env" || p.Line != 5 || !strings.Contains(p.Msg, "export OPENAI_API_KEY=") {
		t.Errorf("problem 0: got %+v, want providers[0].api_key_env on line 5 saying how to set OPENAI_API_KEY", p)
	}
	if p := ps[1]; p.Key != "tenants[0].api_key_env" || !strings.Contains(p.Msg, "export ACME_SLUICE_KEY=") {
		t.Errorf("problem 1: got %+v, want tenants[0].api_key_env saying how to set ACME_SLUICE_KEY", p)
	}
	env["OPENAI_API_KEY"], env["ACME_SLUICE_KEY"] = "sk-test", "a-long-random-string"
	if _, ps := config.Check(data, getenv); len(ps) != 0 {
		t.Errorf("Check with both set: got %v, want no problems", ps)
	}
	if _, err := config.Parse(data); err != nil {
		t.Errorf("Parse does not look at the environment: got %v", err)
	}
}

// Anchors and merge keys are YAML, and a merged mapping's keys are checked
// like the mapping's own.
func TestCheckMergeKeys(t *testing.T) {
	t.Parallel()
	data := `x-limits: &lim {rpm: 10, tpm: 1000}
providers:
  - name: a
    base_url: https://a.example.test
    models:
      - {<<: *lim, name: m1}
      - {<<: *lim, name: m2, rpm: 20}
`
	_, ps := config.Check([]byte(data), nil)
	if len(ps) != 1 || ps[0].Key != "x-limits" {
		t.Fatalf("Check: got %v, want exactly the unknown top-level key x-limits", ps)
	}
	c, err := config.Parse([]byte(strings.Replace(data, "x-limits: &lim", "server: {}\n_: &lim", 1)))
	if err == nil {
		t.Fatalf("Parse accepted an unknown key _: %+v", c)
	}
	ok := "providers:\n  - &p {name: a, base_url: \"https://a.example.test\", models: [{name: m1, rpm: 10}]}\n  - {<<: *p, name: b, models: [{name: m2, rpm: 20}]}\n"
	c, err = config.Parse([]byte(ok))
	if err != nil {
		t.Fatalf("Parse with a merge key: %v", err)
	}
	if got, want := c.Providers[1].BaseURL, "https://a.example.test"; got != want {
		t.Errorf("providers[1].base_url from the merge: got %q, want %q", got, want)
	}
}
