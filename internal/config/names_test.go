package config_test

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/config"
)

// Names that would make two things share a budgets key or a DISPATCH
// consumer are refused; names that only look alike are not.
func TestKeyNameCollisions(t *testing.T) {
	t.Parallel()
	prov := func(name string, models ...string) string {
		s := "  - name: " + name + "\n    base_url: https://api.example.test/v1\n    models:\n"
		for _, m := range models {
			s += "      - name: " + m + "\n"
		}
		return s
	}
	for _, tc := range []struct {
		name, yaml string
		want       []string // "" : accepted
	}{
		{
			name: "provider named like the tenants' concurrency keys",
			yaml: "providers:\n" + prov("tenant", "acme") + "tenants: [{name: acme, max_concurrency: 2}]\n",
			want: []string{`providers[0].name: "tenant" is reserved`},
		},
		{
			name: "two models, one executor consumer",
			yaml: "providers:\n" + prov("a-b", "c") + prov("a", "b-c"),
			want: []string{"providers[1].models[0].name: ", `one executor consumer name, "executor-a-b-c"`},
		},
		{
			name: "alike but apart",
			yaml: "providers:\n" + prov("a-b", "c") + prov("a", "b_c") + prov("tenants", "m") + "tenants: [{name: tenant}]\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse([]byte(tc.yaml))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v, want accepted", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse: accepted, want an error containing %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q, want it to contain %q", err, w)
				}
			}
		})
	}
}
