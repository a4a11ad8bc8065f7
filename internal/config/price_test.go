package config_test

import (
	"math"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/pkg/job"
)

func TestPrice(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`providers:
  - name: p
    base_url: "http://127.0.0.1:1/v1"
    models:
      - {name: m, price: {input_per_mtok: 3, output_per_mtok: 15, cached_input_per_mtok: 0.3, cache_write_per_mtok: 3.75}}
      - {name: plain, price: {input_per_mtok: 1, output_per_mtok: 2, batch_factor: 0.6}}
      - {name: free}
`))
	if err != nil {
		t.Fatal(err)
	}
	u := &job.Usage{PromptTokens: 1_000_000, CachedTokens: 200_000, CacheWriteTokens: 100_000, CompletionTokens: 10_000}
	for _, tc := range []struct {
		model string
		want  float64
	}{
		// 700k plain at 3, 200k read at 0.3, 100k written at 3.75, 10k out at 15.
		{"m", 2.1 + 0.06 + 0.375 + 0.15},
		// Without their own prices, cached and written tokens cost input.
		{"plain", 1 + 0.02},
	} {
		if got, ok := c.CostOf("p", tc.model, job.LaneSync, u); !ok || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: CostOf = %v, %v, want %v, true", tc.model, got, ok, tc.want)
		}
	}
	// An unpriced model's cost is unknown, never zero.
	if got, ok := c.CostOf("p", "free", job.LaneBatch, u); ok {
		t.Errorf("free: CostOf = %v, true; want unpriced", got)
	}
	// A Batch API line pays the model's batch factor: 0.5 unless set.
	for model, want := range map[string]float64{"m": 0.5 * (2.1 + 0.06 + 0.375 + 0.15), "plain": 0.6 * (1 + 0.02)} {
		r := &job.Result{Provider: "p", Model: model, Usage: u, Lane: job.LaneBatch}
		c.PriceResult(r, job.UsageProvider)
		if r.Cost == nil || math.Abs(*r.Cost-want) > 1e-9 {
			t.Errorf("%s in the batch lane: cost %v, want %v", model, r.Cost, want)
		}
	}
	r := &job.Result{Provider: "p", Model: "free", Usage: u}
	c.PriceResult(r, job.UsageProvider)
	if r.Cost != nil || !r.CostUnpriced || r.UsageSource != job.UsageProvider {
		t.Errorf("unpriced result: cost %v, unpriced %v, source %q", r.Cost, r.CostUnpriced, r.UsageSource)
	}
	// Worst case: every prompt token at the dearest input rate (a cache
	// write), every output token.
	_, m, _ := c.ModelRef("m")
	if got, want := m.Price.WorstCase(job.Estimate{PromptTokens: 1000, MaxTokens: 200}), (1000*3.75+200*15)/1e6; math.Abs(got-want) > 1e-12 {
		t.Errorf("WorstCase = %v, want %v", got, want)
	}
	if c.Currency != "USD" {
		t.Errorf("currency defaults to %q, want USD", c.Currency)
	}
	for _, bad := range []string{`{input_per_mtok: -1}`, `{output_per_mtok: .nan}`, `{cached_input_per_mtok: 1e9}`, `{input_per_mtok: 1, per_call: 2}`, `{input_per_mtok: 1, batch_factor: 0}`, `{input_per_mtok: 1, batch_factor: 1.5}`} {
		_, err := config.Parse([]byte(`providers:
  - name: p
    base_url: "http://127.0.0.1:1/v1"
    models: [{name: m, price: ` + bad + `}]
`))
		if err == nil {
			t.Errorf("price %s accepted, want an error", bad)
		}
	}
}

func TestSpendConfig(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`currency: EUR
tenants:
  - {name: a, spend: {per_day: 50, per_month: 1000}}
  - {name: b, spend: {per_day: 5, on_exceed: refuse}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := c.Tenant("a"); a.Spend.OnExceed != config.SpendWait {
		t.Errorf("on_exceed defaults to %q, want wait", a.Spend.OnExceed)
	}
	for bad, key := range map[string]string{
		`currency: dollars`:                                   "currency",
		`tenants: [{name: a, spend: {per_day: -1}}]`:          "tenants[0].spend.per_day",
		`tenants: [{name: a, spend: {per_month: .inf}}]`:      "tenants[0].spend.per_month",
		`tenants: [{name: a, spend: {on_exceed: overshoot}}]`: "tenants[0].spend.on_exceed",
	} {
		_, err := config.Parse([]byte(bad))
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: error %v, want one naming %s", bad, err, key)
		}
	}
}
