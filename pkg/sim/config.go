package sim

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Profiles: how a simulated provider enforces its per-minute limits. Every
// profile also enforces RPM and TPM over a sliding 60-s window, and counts
// rejected requests against RPM there.
const (
	// ProfileQuantized (the default) enforces each limit also over a
	// sliding 1-s window at limit/60 (see Config.BurstFraction), as OpenAI
	// documents: "60,000 requests/minute may be enforced as 1,000
	// requests/second".
	ProfileQuantized = "quantized"
	// ProfileTokenBucket enforces each limit also with a token bucket, as
	// Anthropic documents: refilled continuously at limit/60 per second, it
	// holds at most Config.BucketSeconds seconds of refill and starts full.
	ProfileTokenBucket = "token-bucket"
	// ProfileAzure enforces each limit also over a sliding 10-s window at
	// limit/6, as Azure OpenAI evaluates RPM and TPM over short windows. Its
	// headers are Azure's: only the remaining requests and tokens. It also
	// serves Azure's URLs, with the key in the api-key header (azure.go).
	ProfileAzure = "azure"
	// ProfileAcceleration is ProfileQuantized plus a limit on how fast usage
	// may grow (see Config.AccelFloor), as Anthropic's acceleration limits.
	ProfileAcceleration = "acceleration"
	// ProfileHidden is ProfileQuantized without any x-ratelimit-* header
	// and with 429 messages that name no numbers; Retry-After is still sent.
	ProfileHidden = "hidden"
	// ProfileAnthropic is Anthropic's: /v1/messages limited by continuously
	// refilled buckets of requests, input tokens (cache reads free) and
	// output tokens, with its headers and errors (anthropic.go). Chat
	// completions are limited as under ProfileQuantized.
	ProfileAnthropic = "anthropic"
)

// Profiles returns the profile names New accepts ("" means
// ProfileQuantized).
func Profiles() []string {
	return []string{ProfileQuantized, ProfileTokenBucket, ProfileAzure, ProfileAcceleration, ProfileHidden, ProfileAnthropic}
}

// Defaults applied by New to zero Config fields.
const (
	DefaultProfile       = ProfileQuantized
	DefaultBurstFraction = 1.0 / 60
	DefaultBucketSeconds = 1.0
	DefaultAccelFloor    = 0.25
	DefaultAccelGrowth   = 2.0
	DefaultMaxTokens     = 256
	DefaultHangFor       = 2 * time.Minute
)

// ModelLimits are one model's limits.
type ModelLimits struct {
	Name string // model name as callers send it, e.g. "gpt-4o-mini"
	RPM  int    // requests per minute (0 = unlimited)
	TPM  int    // tokens per minute (0 = unlimited)
	// RPD and TPD are per-day quotas: requests and tokens admitted in the
	// trailing 24 h (0 = none). A request over one is refused 429 the way
	// OpenAI words it ("... on requests per day (RPD): Limit 200, Used
	// 200, Requested 1. Please try again in 7h12m0s."), its wait until
	// the quota has room in Retry-After; it is counted with the model's
	// rate-limited requests (RateLimitedBy requests_per_day or
	// tokens_per_day) and charges nothing.
	RPD, TPD int
	// Units are per-minute limits on other units (images, audio seconds),
	// by name; see units.go for how they are enforced (0 = counted only).
	Units map[string]int
	// Reasoning makes it an OpenAI-style reasoning model: it refuses
	// max_tokens (400, "use max_completion_tokens") and reports part of
	// its completion tokens as completion_tokens_details.reasoning_tokens.
	Reasoning bool
	// ITPM and OTPM are the input- and output-tokens limits of
	// /v1/messages (0 = unlimited); CacheReadsCount charges cache reads
	// to ITPM (see anthropic.go).
	ITPM, OTPM      int
	CacheReadsCount bool
}

// Config shapes a simulated provider.
type Config struct {
	// Models are the models served; requests for others get 404 model_not_found.
	Models []ModelLimits
	// Profile is how the limits are enforced: one of Profiles() (default
	// ProfileQuantized).
	Profile string
	// BurstFraction caps what may be charged in any trailing 1-second window,
	// as a fraction of the per-minute limit: the cap is
	// max(ceil(limit·BurstFraction), 1). A request alone in its second is
	// never rejected by the token cap if it fits the minute. Default 1/60,
	// the limit's average pace; 1 makes the per-second caps equal to the
	// per-minute limits. Profiles quantized, acceleration and hidden only;
	// the others have no 1-s window and ignore it.
	BurstFraction float64
	// BucketSeconds is the capacity of ProfileTokenBucket's and
	// ProfileAnthropic's buckets in seconds of refill: BucketSeconds·limit/60
	// (default 1, 60 under ProfileAnthropic; at most 60). A request costing
	// more than the capacity is admitted only when the bucket is full, and
	// empties it. Other profiles ignore it.
	BucketSeconds float64
	// AccelFloor and AccelGrowth shape ProfileAcceleration's ramp limit:
	// the requests (and tokens) admitted in the trailing 10 s may not
	// exceed the larger of AccelFloor·limit/6 (the floor; default 0.25, in
	// (0, 1]) and AccelGrowth times what was admitted in the 10 s before
	// that (default 2, at least 1). A request alone in its 10 s always
	// passes the ramp. Other profiles ignore them.
	AccelFloor  float64
	AccelGrowth float64
	// NoRateHeaders drops the x-ratelimit-* headers from every response,
	// whatever the profile (ProfileHidden sets it).
	NoRateHeaders bool
	// TTFT is the latency before the first token (default 0).
	TTFT time.Duration
	// PerToken is the additional latency per output token (default 0).
	PerToken time.Duration
	// OutputTokens decides the completion tokens of a request allowed
	// maxTokens output tokens; the result is clamped to [0, maxTokens].
	// Default: a deterministic value in [max/4, max/2] (at least 1) derived
	// from a hash of the body. It must be safe for concurrent use.
	OutputTokens func(maxTokens int, body []byte) int
	// UnitsOf reads what a request costs of its model's units from its
	// body (a unit it leaves out costs DefaultUnitCost). Default: the
	// body's top-level "sim_units" object, {"images": 2}. It must be safe
	// for concurrent use.
	UnitsOf func(body []byte) map[string]int
	// DefaultMaxTokens is the output limit of a request that names neither
	// max_tokens nor max_completion_tokens (default 256).
	DefaultMaxTokens int
	// PadResponseBytes appends this many bytes to every completion's text:
	// an answer far larger than its tokens (tests of answers too large to
	// store). Default 0.
	PadResponseBytes int
	// APIKeys, if non-empty, are the only accepted Authorization: Bearer keys.
	APIKeys []string
	// Now is the clock used for windows, timelines and timestamps (default
	// time.Now). Latency always uses real timers. It must be safe for
	// concurrent use; if it steps backwards, charges are recorded at the
	// latest instant already seen.
	Now func() time.Time
	// Faults injects provider failures.
	Faults Faults
	// Count is how prompt tokens are counted (see count.go): by default
	// characters/4 with its own per-message overhead, not Sluice's
	// tokenizer.
	Count TokenCount
	// IgnoreIdempotencyKey runs every request, whatever its
	// Idempotency-Key, as OpenAI's and Anthropic's completions endpoints
	// do by their documentation; completions are still counted per key
	// (Stats.DuplicateCompletions shows a key completed twice).
	IgnoreIdempotencyKey bool
	// OnArrival, if set, is called with every request a model's rate
	// limits judged, admitted or refused, once they have judged it: the
	// provider's view of each call, for tests and tools that compare it
	// with the caller's plan. It runs on the request's goroutine and must
	// be safe for concurrent use and quick.
	OnArrival func(Arrival)
	// ToolCalls, when positive, answers a request that offers function
	// tools with a call of one (instead of text) while its conversation
	// holds fewer than ToolCalls tool results (responses.go). A request
	// whose tool_choice requires a call gets one whatever ToolCalls says
	// (schema.go).
	ToolCalls int
	// NoResponses makes the simulator a chat-only provider: POST
	// /v1/responses answers 404 as an unknown URL.
	NoResponses bool
	// Batch shapes the Batch APIs (batch.go).
	Batch BatchConfig
}

// Arrival is one request as the rate limits judged it.
type Arrival struct {
	Model string
	// JobID and IdempotencyKey are the request's X-Sluice-Job-Id and
	// Idempotency-Key headers ("" if absent).
	JobID, IdempotencyKey string
	// At is the instant it was judged at: when it reached the server.
	At time.Time
	// Cost is the tokens it was charged (or would have been): prompt plus
	// n times its output limit.
	Cost int64
	// Body is the request as received (shared: do not modify it).
	Body     []byte
	Admitted bool
	// Limit is what refused it, named as in ModelStats.RateLimitedBy
	// ("tokens_short_window", "too_large", ...) or by a unit's name; ""
	// when admitted.
	Limit string
}

// Faults injects provider failures. Rates are probabilities per admitted
// request, drawn from a sequence fixed by Seed; at most one fault applies to a
// request, so the rates must sum to at most 1. The stream faults apply only
// to streamed requests (a non-streamed request that draws one is answered
// normally); RateReset resets streamed requests too, before the first byte.
type Faults struct {
	Seed                      int64
	Rate500, Rate502, Rate503 float64
	// RateReset hijacks the connection and resets it before any response.
	RateReset float64
	// RateHang accepts the request and never answers; the connection is
	// dropped when the client gives up or after HangFor (default 2m).
	RateHang float64
	HangFor  time.Duration
	// RateStreamCut cuts a streamed answer (the connection is reset) after
	// StreamCutAfter content chunks; 0 cuts it after the headers and the
	// role chunk, before the first token.
	RateStreamCut  float64
	StreamCutAfter int
	// RateStreamStall stops a streamed answer after StreamStallAfter
	// content chunks and holds the connection open, silent, until the
	// client gives up or HangFor passes.
	RateStreamStall  float64
	StreamStallAfter int
	// MaxFaults, when positive, is how many faults are injected in all
	// (since start or Reset); later requests draw none. With a rate of 1,
	// MaxFaults 1 faults exactly the first admitted request.
	MaxFaults int
	// QuotaModels and QuotaKeys answer 429 insufficient_quota (no
	// Retry-After, nothing charged) for these models and API keys.
	QuotaModels []string
	QuotaKeys   []string
}

func (f Faults) any() bool {
	return f.Rate500+f.Rate502+f.Rate503+f.RateReset+f.RateHang+f.RateStreamCut+f.RateStreamStall > 0
}

// withDefaults returns a copy of c with defaults filled in, or the first
// problem found in it.
func (c Config) withDefaults() (Config, error) {
	if c.Profile == "" {
		c.Profile = DefaultProfile
	}
	if c.Profile == ProfileHidden {
		c.NoRateHeaders = true
	}
	if c.BurstFraction == 0 {
		c.BurstFraction = DefaultBurstFraction
	}
	if c.BucketSeconds == 0 && c.Profile == ProfileAnthropic {
		c.BucketSeconds = 60 // "continuously replenished up to your maximum limit"
	}
	if c.BucketSeconds == 0 {
		c.BucketSeconds = DefaultBucketSeconds
	}
	if c.AccelFloor == 0 {
		c.AccelFloor = DefaultAccelFloor
	}
	if c.AccelGrowth == 0 {
		c.AccelGrowth = DefaultAccelGrowth
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
	if c.UnitsOf == nil {
		c.UnitsOf = bodyUnits
	}
	if c.Batch.Expiry == 0 {
		c.Batch.Expiry = DefaultBatchExpiry
	}
	var err error
	if c.Count, err = c.Count.withDefaults(); err != nil {
		return c, err
	}
	return c, c.check()
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
		case m.RPM < 0 || m.TPM < 0 || m.RPD < 0 || m.TPD < 0 || m.ITPM < 0 || m.OTPM < 0:
			return fmt.Errorf("model %q: limits must be >= 0 (RPM %d, TPM %d, RPD %d, TPD %d)", m.Name, m.RPM, m.TPM, m.RPD, m.TPD)
		}
		for name, limit := range m.Units {
			if name == "" || limit < 0 {
				return fmt.Errorf("model %q: unit %q: a unit needs a name and a limit >= 0, got %d", m.Name, name, limit)
			}
		}
		seen[m.Name] = true
	}
	if !slices.Contains(Profiles(), c.Profile) {
		return fmt.Errorf("unknown profile %q; valid profiles: %s", c.Profile, strings.Join(Profiles(), ", "))
	}
	if c.BurstFraction < 0 || c.BurstFraction > 1 {
		return fmt.Errorf("burst fraction must be in [0, 1], got %g", c.BurstFraction)
	}
	if c.BucketSeconds < 0.001 || c.BucketSeconds > 60 {
		return fmt.Errorf("bucket seconds must be in [0.001, 60], got %g", c.BucketSeconds)
	}
	if c.Profile == ProfileTokenBucket || c.Profile == ProfileAnthropic {
		ms := bucketMillis(c.BucketSeconds)
		for _, m := range c.Models {
			if int64(max(m.RPM, m.TPM, m.ITPM, m.OTPM)) > maxBucketUnits/ms {
				return fmt.Errorf("model %q: limits too large for a %gs token bucket", m.Name, c.BucketSeconds)
			}
		}
	}
	if c.AccelFloor <= 0 || c.AccelFloor > 1 {
		return fmt.Errorf("acceleration floor must be in (0, 1], got %g", c.AccelFloor)
	}
	if c.AccelGrowth < 1 {
		return fmt.Errorf("acceleration growth must be at least 1, got %g", c.AccelGrowth)
	}
	if c.TTFT < 0 || c.PerToken < 0 {
		return errors.New("latencies must be >= 0")
	}
	if c.DefaultMaxTokens < 0 {
		return fmt.Errorf("default max tokens must be >= 0, got %d", c.DefaultMaxTokens)
	}
	if c.PadResponseBytes < 0 {
		return fmt.Errorf("response padding must be >= 0, got %d", c.PadResponseBytes)
	}
	if b := c.Batch; b.Duration < 0 || b.Expiry < 0 || b.EnqueuedTokens < 0 || b.QueueRequests < 0 || b.MaxRequests < 0 || b.MaxBytes < 0 {
		return errors.New("batch duration, expiry and limits must be >= 0")
	}
	for i, k := range c.APIKeys {
		if k == "" {
			return fmt.Errorf("api_keys[%d] is empty", i)
		}
	}
	return c.Faults.check()
}

func (f Faults) check() error {
	rates := []float64{f.Rate500, f.Rate502, f.Rate503, f.RateReset, f.RateHang, f.RateStreamCut, f.RateStreamStall}
	for _, r := range rates {
		if r < 0 || r > 1 {
			return fmt.Errorf("fault rates must be in [0, 1], got %g", r)
		}
	}
	if f.StreamCutAfter < 0 || f.StreamStallAfter < 0 || f.MaxFaults < 0 {
		return errors.New("stream fault positions and max faults must be >= 0")
	}
	if sum := f.Rate500 + f.Rate502 + f.Rate503 + f.RateReset + f.RateHang + f.RateStreamCut + f.RateStreamStall; sum > 1+1e-9 {
		return fmt.Errorf("fault rates sum to %g; at most 1", sum)
	}
	if f.HangFor < 0 {
		return fmt.Errorf("hang duration must be >= 0, got %v", f.HangFor)
	}
	return nil
}

// hashedOutputTokens is the default Config.OutputTokens: a value in
// [max/4, max/2], at least 1, fixed by the body's FNV-1a hash. The body is
// hashed without its stream and stream_options members, so the same
// request gets the same answer streamed or not.
func hashedOutputTokens(maxTokens int, body []byte) int {
	body = job.WithoutMembers(body, "stream", "stream_options")
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
