package config

import (
	"fmt"
	"math"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Price is what a model's provider charges, in US dollars per million
// tokens. Sluice uses it only to report spend not paid (the response
// cache's hits and joins); budgets count tokens, never money.
type Price struct {
	Input  float64 `yaml:"input_per_mtok"`
	Output float64 `yaml:"output_per_mtok"`
	// CachedInput prices prompt tokens read from the provider's own
	// prompt cache, CacheWrite those written to it (Anthropic); absent,
	// they cost Input.
	CachedInput *float64 `yaml:"cached_input_per_mtok"`
	CacheWrite  *float64 `yaml:"cache_write_per_mtok"`
}

// USD is what a call with usage u costs at p.
func (p *Price) USD(u *job.Usage) float64 {
	if p == nil || u == nil {
		return 0
	}
	cached, write := p.Input, p.Input
	if p.CachedInput != nil {
		cached = *p.CachedInput
	}
	if p.CacheWrite != nil {
		write = *p.CacheWrite
	}
	// Cached and written tokens are part of PromptTokens (job.Usage).
	plain := max(u.PromptTokens-u.CachedTokens-u.CacheWriteTokens, 0)
	return (float64(plain)*p.Input + float64(u.CachedTokens)*cached + float64(u.CacheWriteTokens)*write +
		float64(u.CompletionTokens)*p.Output) / 1e6
}

// checkPrices checks providers[].models[].price.
func (c *Config) checkPrices(fail failFunc) {
	for i, p := range c.Providers {
		for j, m := range p.Models {
			if m.Price == nil {
				continue
			}
			key := fmt.Sprintf("providers[%d].models[%d].price", i, j)
			for _, f := range []struct {
				name string
				v    *float64
			}{{"input_per_mtok", &m.Price.Input}, {"output_per_mtok", &m.Price.Output},
				{"cached_input_per_mtok", m.Price.CachedInput}, {"cache_write_per_mtok", m.Price.CacheWrite}} {
				if f.v != nil && (*f.v < 0 || math.IsNaN(*f.v) || math.IsInf(*f.v, 0) || *f.v > maxPrice) {
					fail(key+"."+f.name, "must be US dollars per million tokens, 0 to %g, got %g", float64(maxPrice), *f.v)
				}
			}
		}
	}
}

// maxPrice bounds a price per million tokens: far above any model's, low
// enough that a typo of a few digits is caught.
const maxPrice = 10000
