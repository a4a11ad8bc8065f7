package config

import (
	"fmt"
	"math"
	"regexp"

	"github.com/sluice-dev/sluice/pkg/clip"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Price is what a model's provider charges, in the configuration's currency
// (Config.Currency) per million tokens. It is the cost model: every
// result's cost (Config.CostOf), the spend budgets' reservations
// (WorstCase) and the response cache's savings are computed from it.
type Price struct {
	Input  float64 `yaml:"input_per_mtok"`
	Output float64 `yaml:"output_per_mtok"`
	// CachedInput prices prompt tokens read from the provider's own
	// prompt cache, CacheWrite those written to it (Anthropic); absent,
	// they cost Input.
	CachedInput *float64 `yaml:"cached_input_per_mtok"`
	CacheWrite  *float64 `yaml:"cache_write_per_mtok"`
	// BatchFactor is the share of these prices a call made through the
	// provider's Batch API pays (a result with Lane job.LaneBatch): in
	// (0, 1]; absent, DefaultBatchFactor.
	BatchFactor *float64 `yaml:"batch_factor"`
}

// DefaultBatchFactor is what OpenAI's Batch API and Anthropic's Message
// Batches charge of their list prices: half.
const DefaultBatchFactor = 0.5

// batchFactor is p's BatchFactor or the default.
func (p *Price) batchFactor() float64 {
	if p.BatchFactor != nil {
		return *p.BatchFactor
	}
	return DefaultBatchFactor
}

// DefaultCurrency is the currency prices and spend are in when the
// configuration names none.
const DefaultCurrency = "USD"

// cost is what a call with usage u costs at p.
func (p *Price) cost(u *job.Usage) float64 {
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

// WorstCase is the most a job with estimate e can cost at p: every prompt
// token at the dearest input rate (a cache write costs more than plain
// input) and every output token it may produce (e.MaxTokens: max_tokens
// times n; a thinking budget is part of max_tokens).
func (p *Price) WorstCase(e job.Estimate) float64 {
	in := p.Input
	if p.CacheWrite != nil {
		in = max(in, *p.CacheWrite)
	}
	if p.CachedInput != nil {
		in = max(in, *p.CachedInput)
	}
	return (float64(e.PromptTokens)*in + float64(e.MaxTokens)*p.Output) / 1e6
}

// PriceOf is the price of a provider's model; nil when it has none
// (unpriced) or is not configured.
func (c *Config) PriceOf(provider, model string) *Price {
	if _, m, ok := c.Deployment(provider, model); ok {
		return m.Price
	}
	return nil
}

// CostOf is the one computation of what a call cost: usage u times the
// price of provider's model, times its batch factor for a call made in
// lane job.LaneBatch. ok is false when the model is unpriced (or u is
// nil): its cost is unknown, never zero.
func (c *Config) CostOf(provider, model, lane string, u *job.Usage) (cost float64, ok bool) {
	p := c.PriceOf(provider, model)
	if p == nil || u == nil {
		return 0, false
	}
	if lane == job.LaneBatch {
		return p.cost(u) * p.batchFactor(), true
	}
	return p.cost(u), true
}

// PriceResult sets r's cost from its usage and its model's price, and
// says where the usage came from (source: job.UsageProvider or
// job.UsageEstimate). A result without usage is left without cost; one
// whose model is unpriced says so (CostUnpriced).
func (c *Config) PriceResult(r *job.Result, source string) {
	r.Cost, r.CostUnpriced, r.UsageSource = nil, false, ""
	if r.Usage == nil {
		return
	}
	r.UsageSource = source
	if v, ok := c.CostOf(r.Provider, r.Model, r.Lane, r.Usage); ok {
		r.Cost = &v
	} else {
		r.CostUnpriced = true
	}
}

// checkPrices checks providers[].models[].price and currency.
func (c *Config) checkPrices(fail failFunc) {
	if !currencyCode.MatchString(c.Currency) {
		fail("currency", "must be a currency code of 3 capital letters (ISO 4217, as USD or EUR), got %q", clip.String(c.Currency, shown))
	}
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
					fail(key+"."+f.name, "must be %s per million tokens, 0 to %g, got %g", c.Currency, float64(maxPrice), *f.v)
				}
			}
			if f := m.Price.BatchFactor; f != nil && !(*f > 0 && *f <= 1) {
				fail(key+".batch_factor", "must be the share of the price a Batch API call pays, in (0, 1], got %g", *f)
			}
		}
	}
}

var currencyCode = regexp.MustCompile(`^[A-Z]{3}$`)

// maxPrice bounds a price per million tokens: far above any model's, low
// enough that a typo of a few digits is caught.
const maxPrice = 10000
