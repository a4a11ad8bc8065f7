package config

import (
	"fmt"
	"math"

	"github.com/sluice-dev/sluice/pkg/clip"
)

// Spend is a tenant's spend budget: what its calls may cost, in the
// configuration's currency, per UTC day and per UTC month (0 = no cap).
// Admission reserves each job's worst-case cost before the call and
// settles it to the reported usage's cost after (internal/budget's
// SpendLedger), so spend never exceeds either cap.
type Spend struct {
	PerDay   float64 `yaml:"per_day"`
	PerMonth float64 `yaml:"per_month"`
	// OnExceed is what happens to a job that does not fit: SpendWait (the
	// default) keeps it queued until it fits or its deadline passes;
	// SpendRefuse ends it at once with job.CodeSpendBudget.
	OnExceed string `yaml:"on_exceed"`
}

// What a job that does not fit a spend budget does (Spend.OnExceed).
const (
	SpendWait   = "wait"
	SpendRefuse = "refuse"
)

// maxSpend bounds a spend cap (the ledger counts in billionths).
const maxSpend = 1e9

func (c *Config) spendDefaults() {
	if c.Currency == "" {
		c.Currency = DefaultCurrency
	}
	for i := range c.Tenants {
		if s := c.Tenants[i].Spend; s != nil && s.OnExceed == "" {
			s.OnExceed = SpendWait
		}
	}
}

// checkSpend checks tenants[].spend.
func (c *Config) checkSpend(fail failFunc) {
	for i, t := range c.Tenants {
		s := t.Spend
		if s == nil {
			continue
		}
		key := fmt.Sprintf("tenants[%d].spend", i)
		for _, f := range []struct {
			name string
			v    float64
		}{{"per_day", s.PerDay}, {"per_month", s.PerMonth}} {
			if f.v < 0 || math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v > maxSpend {
				fail(key+"."+f.name, "must be %s from 0 (no cap) to %g, got %g", c.Currency, float64(maxSpend), f.v)
			}
		}
		if s.OnExceed != SpendWait && s.OnExceed != SpendRefuse {
			fail(key+".on_exceed", "must be %q or %q, got %q", SpendWait, SpendRefuse, clip.String(s.OnExceed, shown))
		}
	}
}
