package config_test

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/config"
)

// FuzzParse: no configuration file, however broken, panics the loader; one
// it accepts has the defaults filled and passes its own validation.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`
providers:
  - name: openai
    base_url: https://api.openai.com/v1
    api_key_env: OPENAI_API_KEY
    models: [{name: gpt-4o-mini, rpm: 500, tpm: 200000}]
tenants: [{name: acme, api_key_env: ACME_KEY, weight: 2, tpm: 1000}]
limits: {max_body_bytes: 65536, result_retention: 1h}
admission: {slice: 250ms, burst_fraction: 0.5}
`))
	f.Add([]byte("providers: [{name: p, models: [{name: m, rpm: -1}]}]"))
	f.Add([]byte("limits: {result_retention: 1e300h}"))
	f.Add([]byte("admission: {slice: -5s, headroom: .nan}"))
	f.Add([]byte("tenants: [{name: a}, {name: a}]\nroutes: [{task: t, primary: {provider: x, model: y}}]"))
	f.Add([]byte("&a [*a, *a]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := config.Parse(data)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if c.Limits.MaxBodyBytes <= 0 || c.Limits.MaxResponseBytes <= 0 || c.Limits.ResultRetention <= 0 || c.Admission.Slice <= 0 {
			t.Fatalf("accepted config without defaults: limits %+v, slice %s", c.Limits, c.Admission.Slice.D())
		}
		for _, p := range c.Providers {
			for _, m := range p.Models {
				if m.RPM < 0 || m.TPM < 0 || m.MaxConcurrency < 0 {
					t.Fatalf("accepted negative limits on %s/%s: %+v", p.Name, m.Name, m)
				}
			}
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config fails Validate: %v", err)
		}
	})
}

// FuzzDuration: a duration value never panics and is never accepted
// negative where the loader requires a positive one.
func FuzzDuration(f *testing.F) {
	for _, s := range []string{"250ms", "1h", "-1s", "1e300h", "9223372036854775807ns", "5", "", "1h2m3.5s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		c, err := config.Parse([]byte("limits:\n  result_retention: \"" + strings.NewReplacer(`"`, ``, `\`, ``, "\n", ``).Replace(v) + "\"\n"))
		if err == nil && c.Limits.ResultRetention <= 0 {
			t.Fatalf("result_retention %q accepted as %s", v, c.Limits.ResultRetention.D())
		}
	})
}
