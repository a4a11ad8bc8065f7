package config_test

import (
	"math"
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
      - {name: plain, price: {input_per_mtok: 1, output_per_mtok: 2}}
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
		{"free", 0},
	} {
		_, m, ok := c.ModelRef(tc.model)
		if !ok {
			t.Fatalf("model %s not found", tc.model)
		}
		if got := m.Price.USD(u); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: USD = %v, want %v", tc.model, got, tc.want)
		}
	}
	for _, bad := range []string{`{input_per_mtok: -1}`, `{output_per_mtok: .nan}`, `{cached_input_per_mtok: 1e9}`, `{input_per_mtok: 1, per_call: 2}`} {
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
