package config

import "github.com/sluice-dev/sluice/internal/budget"

// Anthropic limits input and output tokens per minute apart (ITPM, OTPM)
// and does not count cache reads toward ITPM on most models; OpenAI-kind
// providers have one tpm charged prompt + max tokens at arrival. A model
// states the limits of its provider's kind: itpm, otpm and
// cache_reads_count on an anthropic provider, tpm on the others.

// SplitsOutput reports whether a model of a provider of this kind is
// limited on input and output tokens apart.
func SplitsOutput(kind string) bool { return kind == "anthropic" }

// SplitsOutput reports whether the model's provider limits input and
// output tokens apart: the tokens dimension then counts input tokens and
// cache writes (and cache reads when CacheReadsCount), and output tokens
// are limited by OTPM, charged max_tokens at admission and corrected to
// the output reported.
func (m Model) SplitsOutput() bool { return m.splits }

// WarmsUp reports whether a model the fleet has never seen starts at half
// its limits and ramps up (its provider's kind asks for load to grow
// gradually: anthropic, azure); an openai model starts at its limits.
func (m Model) WarmsUp() bool { return m.warms }

// Rule is how the budget ledger counts the model's calls (internal/budget):
// its provider kind's rule, chosen here and nowhere else.
func (m Model) Rule() budget.Rule {
	return budget.Rule{Split: m.splits, CacheReads: m.splits && m.CacheReadsCount,
		Refill: budget.Limits{RPM: m.RPM, TPM: m.TokenLimit(), OTPM: m.OTPM}, Units: m.UnitNames()}
}

// TokenLimit is the per-minute limit of the model's tokens dimension: tpm
// (prompt + max tokens), or on an anthropic provider itpm (input tokens
// and cache writes).
func (m Model) TokenLimit() int { return m.TPM + m.ITPM }

func checkTokenLimits(kind string, m Model, mk string, fail func(key, format string, args ...any)) {
	if SplitsOutput(kind) {
		if m.TPM != 0 {
			fail(mk+".tpm", "an anthropic provider limits input and output tokens apart: use itpm and otpm")
		}
	} else {
		for _, f := range []struct {
			key string
			set bool
		}{{"itpm", m.ITPM != 0}, {"otpm", m.OTPM != 0}, {"cache_reads_count", m.CacheReadsCount}} {
			if f.set {
				fail(mk+"."+f.key, "applies to anthropic providers only (this one's kind is %s; use tpm)", kind)
			}
		}
	}
	if m.ITPM < 0 {
		fail(mk+".itpm", "must be >= 0 (0 = no limit), got %d", m.ITPM)
	}
	if m.OTPM < 0 {
		fail(mk+".otpm", "must be >= 0 (0 = no limit), got %d", m.OTPM)
	}
}
