package sim

import (
	"errors"
	"fmt"
	"time"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultBurstFraction = 0.1
	DefaultMaxTokens     = 256
	DefaultHangFor       = 2 * time.Minute
)

// ModelLimits are one model's per-minute limits.
type ModelLimits struct {
	Name string // model name as callers send it, e.g. "gpt-4o-mini"
	RPM  int    // requests per minute (0 = unlimited)
	TPM  int    // tokens per minute (0 = unlimited)
}

// Config shapes a simulated provider.
type Config struct {
	// Models are the models served; requests for others get 404 model_not_found.
	Models []ModelLimits
	// BurstFraction caps what may be charged in any trailing 1-second window,
	// as a fraction of the per-minute limit: the cap is
	// max(ceil(limit·BurstFraction), 1). A request alone in its second is
	// never rejected by the token cap if it fits the minute. Default 0.1; 1
	// makes the per-second caps equal to the per-minute limits.
	BurstFraction float64
	// TTFT is the latency before the first token (default 0).
	TTFT time.Duration
	// PerToken is the additional latency per output token (default 0).
	PerToken time.Duration
	// OutputTokens decides the completion tokens of a request allowed
	// maxTokens output tokens; the result is clamped to [0, maxTokens].
	// Default: a deterministic value in [max/4, max/2] (at least 1) derived
	// from a hash of the body. It must be safe for concurrent use.
	OutputTokens func(maxTokens int, body []byte) int
	// DefaultMaxTokens is the output limit of a request that names neither
	// max_tokens nor max_completion_tokens (default 256).
	DefaultMaxTokens int
	// APIKeys, if non-empty, are the only accepted Authorization: Bearer keys.
	APIKeys []string
	// Now is the clock used for windows, timelines and timestamps (default
	// time.Now). Latency always uses real timers. It must be safe for
	// concurrent use; if it steps backwards, charges are recorded at the
	// latest instant already seen.
	Now func() time.Time
	// Faults injects provider failures.
	Faults Faults
}

// Faults injects provider failures. Rates are probabilities per admitted
// request, drawn from a sequence fixed by Seed; at most one fault applies to a
// request, so the rates (except RateStreamCut) must sum to at most 1.
type Faults struct {
	Seed                      int64
	Rate500, Rate502, Rate503 float64
	// RateReset hijacks the connection and resets it before any response.
	RateReset float64
	// RateHang accepts the request and never answers; the connection is
	// dropped when the client gives up or after HangFor (default 2m).
	RateHang float64
	HangFor  time.Duration
	// RateStreamCut is reserved for streaming responses and ignored for now.
	RateStreamCut float64
	// QuotaModels and QuotaKeys answer 429 insufficient_quota (no
	// Retry-After, nothing charged) for these models and API keys.
	QuotaModels []string
	QuotaKeys   []string
}

func (f Faults) any() bool {
	return f.Rate500+f.Rate502+f.Rate503+f.RateReset+f.RateHang > 0
}

// withDefaults returns a copy of c with defaults filled in, or the first
// problem found.
func (c Config) withDefaults() (Config, error) {
	if err := c.check(); err != nil {
		return c, err
	}
	if c.BurstFraction == 0 {
		c.BurstFraction = DefaultBurstFraction
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = DefaultMaxTokens
	}
	if c.Faults.HangFor == 0 {
		c.Faults.HangFor = DefaultHangFor
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.OutputTokens == nil {
		c.OutputTokens = hashedOutputTokens
	}
	return c, nil
}

func (c Config) check() error {
	if len(c.Models) == 0 {
		return errors.New("no models configured")
	}
	seen := make(map[string]bool, len(c.Models))
	for i, m := range c.Models {
		switch {
		case m.Name == "":
			return fmt.Errorf("models[%d]: name is required", i)
		case seen[m.Name]:
			return fmt.Errorf("models[%d]: model %q listed twice", i, m.Name)
		case m.RPM < 0 || m.TPM < 0:
			return fmt.Errorf("model %q: limits must be >= 0 (RPM %d, TPM %d)", m.Name, m.RPM, m.TPM)
		}
		seen[m.Name] = true
	}
	if c.BurstFraction < 0 || c.BurstFraction > 1 {
		return fmt.Errorf("burst fraction must be in [0, 1], got %g", c.BurstFraction)
	}
	if c.TTFT < 0 || c.PerToken < 0 {
		return errors.New("latencies must be >= 0")
	}
	if c.DefaultMaxTokens < 0 {
		return fmt.Errorf("default max tokens must be >= 0, got %d", c.DefaultMaxTokens)
	}
	for i, k := range c.APIKeys {
		if k == "" {
			return fmt.Errorf("api_keys[%d] is empty", i)
		}
	}
	return c.Faults.check()
}

func (f Faults) check() error {
	rates := []float64{f.Rate500, f.Rate502, f.Rate503, f.RateReset, f.RateHang, f.RateStreamCut}
	for _, r := range rates {
		if r < 0 || r > 1 {
			return fmt.Errorf("fault rates must be in [0, 1], got %g", r)
		}
	}
	if sum := f.Rate500 + f.Rate502 + f.Rate503 + f.RateReset + f.RateHang; sum > 1+1e-9 {
		return fmt.Errorf("fault rates sum to %g; at most 1", sum)
	}
	if f.HangFor < 0 {
		return fmt.Errorf("hang duration must be >= 0, got %v", f.HangFor)
	}
	return nil
}

// hashedOutputTokens is the default Config.OutputTokens: a value in
// [max/4, max/2], at least 1, fixed by the body's FNV-1a hash.
func hashedOutputTokens(maxTokens int, body []byte) int {
	lo, hi := maxTokens/4, maxTokens/2
	if hi < 1 {
		return 1
	}
	return max(lo+int(fnv64(body)%uint64(hi-lo+1)), 1)
}

func fnv64(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}
