package config_test

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/config"
)

// Two tenants sharing an HTTP key fail `up --check` (config.Check with the
// environment), whether they name one variable or two holding the same key.
func TestCheckSharedTenantKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, envB string }{{"one variable", "A_KEY"}, {"two variables", "B_KEY"}} {
		data := []byte(`providers:
  - {name: p, base_url: "http://127.0.0.1:1/v1", models: [{name: m}]}
tenants:
  - {name: a, api_key_env: A_KEY}
  - {name: b, api_key_env: ` + tc.envB + `}
`)
		env := map[string]string{"A_KEY": "same-long-key", "B_KEY": "same-long-key"}
		_, ps := config.Check(data, func(k string) string { return env[k] })
		if len(ps) != 1 || ps[0].Key != "tenants[1].api_key_env" || !strings.Contains(ps[0].Msg, `tenant "a"`) {
			t.Errorf("%s: got problems %v, want one on tenants[1].api_key_env naming tenant a", tc.name, ps)
		}
		for _, p := range ps {
			if strings.Contains(p.Msg, "same-long-key") {
				t.Errorf("%s: a problem shows the key: %q", tc.name, p.Msg)
			}
		}
		env["B_KEY"] = "another-long-key"
		if tc.envB == "B_KEY" {
			if _, ps := config.Check(data, func(k string) string { return env[k] }); len(ps) != 0 {
				t.Errorf("%s with distinct keys: got %v, want no problems", tc.name, ps)
			}
		}
	}
}

func TestFieldDenied(t *testing.T) {
	t.Parallel()
	m := config.Model{Name: "m", AllowFields: []string{"service_tier"}, DenyFields: []string{"logit_bias"}}
	for _, tc := range []struct {
		field string
		want  bool
	}{{"service_tier", false}, {"modalities", true}, {"web_search_options", true}, {"logit_bias", true}, {"temperature", false}} {
		if got := m.FieldDenied(tc.field); got != tc.want {
			t.Errorf("FieldDenied(%q) = %v, want %v", tc.field, got, tc.want)
		}
	}
	if !(config.Model{}).FieldDenied("service_tier") {
		t.Error("a model without allow_fields lets service_tier through; want it denied by default")
	}
}

func TestTenantBytesAndTaskLabel(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`providers:
  - {name: p, base_url: "http://127.0.0.1:1/v1", models: [{name: m}]}
tenants: [{name: a}, {name: b}, {name: c}, {name: d}]
routes:
  - {task: summarize, primary: {provider: p, model: m}}
queues:
  intake: {max_bytes_per_tenant: 2097152}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Queues.Queue.TenantBytes(len(c.Tenants)), config.DefaultQueueBounds.MaxBytes/4; got != want {
		t.Errorf("QUEUE bytes per tenant = %d, want a quarter of max_bytes (%d)", got, want)
	}
	if got := c.Queues.Intake.TenantBytes(len(c.Tenants)); got != 2<<20 {
		t.Errorf("INTAKE bytes per tenant = %d, want the configured 2097152", got)
	}
	for task, want := range map[string]string{"": "default", "summarize": "summarize", "x-1": "other"} {
		if got := c.TaskLabel(task); got != want {
			t.Errorf("TaskLabel(%q) = %q, want %q", task, got, want)
		}
	}
	if _, err := config.Parse([]byte("queues:\n  queue: {max_bytes_per_tenant: 10}\n")); err == nil || !strings.Contains(err.Error(), "queues.queue.max_bytes_per_tenant") {
		t.Errorf("a 10-byte tenant bound: got %v, want an error naming queues.queue.max_bytes_per_tenant", err)
	}
}
