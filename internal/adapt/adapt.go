// Package adapt learns the limits a provider really enforces, per
// provider/model, and shares them with the whole fleet through one KV key
// (learn.<provider>.<model>), so every admission process paces against the
// same figures and a restarted fleet starts from what it learned.
//
// The limits in effect for a dimension (requests, tokens) are the lowest of:
// the configured per-minute limit, the one the provider states (x-ratelimit-
// limit-*, anthropic-ratelimit-*-limit, or its 429 message), and the one
// learned from 429s. Nothing here ever goes above what the configuration or
// the provider states.
//
// Learning follows what works in production congestion control:
//
//   - every 429 is classified (provider.ClassifyRateLimit); quota and
//     billing refusals never adapt (operator action);
//   - a per-second ("burst") refusal cuts the per-second cap by Beta; a
//     per-minute one sets the learned minute limit to what the fleet's own
//     window held when it came (the provider's count, as far as the fleet
//     knows) less a margin, or adopts the limit the provider states;
//   - at most one cut per epoch: a refusal of a call reserved before the
//     last cut (plus the time it takes admission to see it) says nothing
//     new and does not cut again;
//   - recovery is gradual and settles rather than oscillates: nothing for
//     Settle after a cut, then a slow additive probe (Probe of the learned
//     value per minute) back toward the ceiling; a refusal ends the probe
//     with another cut at the level that failed;
//   - warm-up: after a hold (Retry-After), an acceleration refusal or for a
//     model with no record (unless Config.NoWarmUp), the limits ramp from
//     half to whole over Ramp;
//   - discovery: a limit configured as 0 on a model with adaptive: true
//     starts at DiscoverStart and doubles every DiscoverDoubling until the
//     provider states a limit or refuses a call.
package adapt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/provider"
)

// Dimensions. Output is output tokens limited apart (Anthropic's OTPM;
// Tokens is then the input, ITPM).
const (
	Requests = 0
	Tokens   = 1
	Output   = 2
	Dims     = 3 // how many dimensions adapt
)

// Tuning. They are constants: every process must compute the same limits
// from the same record.
const (
	Beta             = 0.75             // per-second cap kept on a burst cut (at most)
	MinuteMargin     = 0.97             // learned minute limit: what the window held, less 3 %
	Settle           = 60 * time.Second // no probing for this long after a cut
	Probe            = 0.02             // then grow by this share of the learned value per minute
	QuantumRecovery  = 0.05             // per-second factor regained per minute after Settle
	Ramp             = 10 * time.Second // warm-up from half to whole
	DiscoverDoubling = 30 * time.Second
	// EpochSlack is how long after a cut calls may still have been reserved
	// at the old limits (admission refreshes every AdmissionRefresh).
	EpochSlack       = time.Second
	AdmissionRefresh = 250 * time.Millisecond
	// HoldRamp is the shortest Retry-After that starts a warm-up (a
	// fleet-wide hold); shorter ones on an unknown refusal mean a burst.
	HoldRamp = 2 * time.Second
	// BurstConfirm: a burst refusal cuts only when another came within
	// this long before it. One alone is as likely the mesh's own timing (a
	// call that reached the provider late, into the next call's second) as
	// a cap below the configured one, and a cut costs a quarter of the
	// rate for minutes; a cap that is really lower refuses again at once.
	BurstConfirm = 30 * time.Second
)

// DiscoverStart is where a discovered limit starts: requests and tokens
// per minute.
var DiscoverStart = [Dims]int{60, 60_000, 60_000}

// State is the fleet's record for one provider/model.
type State struct {
	// Stated are per-minute limits the provider stated (0: none).
	Stated [Dims]int `json:"stated,omitzero"`
	// Learned are per-minute limits set at the last minute cut (0: none),
	// at LearnedAt (unix ms); Discovering marks a discovered limit still
	// growing.
	Learned     [Dims]int   `json:"learned,omitzero"`
	LearnedAt   [Dims]int64 `json:"learned_at,omitzero"`
	Discovering [Dims]bool  `json:"discovering,omitzero"`
	// Quantum is the factor on the per-second cap set at the last burst
	// cut (0: none, i.e. 1), at QuantumAt (unix ms).
	Quantum   [Dims]float64 `json:"quantum,omitzero"`
	QuantumAt [Dims]int64   `json:"quantum_at,omitzero"`
	// BurstSeen is when a burst refusal that did not cut came (unix ms;
	// BurstConfirm).
	BurstSeen int64 `json:"burst_seen,omitempty"`
	// Epoch is the last cut (unix ms); RampFrom the start of a warm-up.
	Epoch    int64 `json:"epoch,omitempty"`
	RampFrom int64 `json:"ramp_from,omitempty"`
	Cuts     int64 `json:"cuts,omitempty"`
	// LastReason is why the last cut was made.
	LastReason string `json:"last_reason,omitempty"`
}

// Config is what the configuration says of a model.
type Config struct {
	RPM, TPM int
	// SplitOutput: the provider limits output tokens apart (OTPM), and
	// TPM is its input limit (ITPM).
	SplitOutput   bool
	OTPM          int
	Adapts        bool // learn and lower (absent or true in the config)
	Discovers     bool // a 0 limit is discovered (adaptive: true)
	BurstFraction float64
	// NoWarmUp: a model with no record starts at its limits, not at half
	// (its provider documents no acceleration limit: OpenAI). An
	// acceleration refusal or a hold still starts a warm-up.
	NoWarmUp bool
}

// Effective are the limits in effect at an instant.
type Effective struct {
	// PerMinute and PerSecond by dimension (0: unlimited).
	PerMinute [Dims]int
	PerSecond [Dims]int
	// Configured, Stated and Learned are what each source says (0: none),
	// for display.
	Configured, Stated, Learned [Dims]int
	Ramp                        float64 // warm-up factor, 1 when none
}

// Limits returns e as budget limits.
func (e Effective) Limits() budget.Limits {
	return budget.Limits{RPM: e.PerMinute[Requests], TPM: e.PerMinute[Tokens], OTPM: e.PerMinute[Output],
		BurstRequests: e.PerSecond[Requests], BurstTokens: e.PerSecond[Tokens], BurstOutput: e.PerSecond[Output]}
}

// Compute returns the limits in effect at now.
func Compute(c Config, st State, now time.Time) Effective {
	ms := now.UnixMilli()
	e := Effective{Configured: [Dims]int{c.RPM, c.TPM, c.OTPM}, Stated: st.Stated, Ramp: 1}
	if !c.Adapts {
		e.PerMinute = e.Configured
		for d := range Dims {
			e.PerSecond[d] = perSecond(e.PerMinute[d], c.burstFraction(), 1)
		}
		return e
	}
	if st.RampFrom > 0 && ms >= st.RampFrom {
		e.Ramp = min(1, 0.5+0.5*float64(ms-st.RampFrom)/float64(Ramp.Milliseconds()))
	} else if st.RampFrom > ms {
		e.Ramp = 0.5 // a hold not over yet: resume at half
	}
	for d := range Dims {
		ceiling := lowest(e.Configured[d], st.Stated[d])
		cur := 0
		if st.Learned[d] > 0 {
			since := float64(ms - st.LearnedAt[d])
			v := float64(st.Learned[d])
			switch {
			case st.Discovering[d]:
				v *= math.Pow(2, max(since, 0)/float64(DiscoverDoubling.Milliseconds()))
			case since > float64(Settle.Milliseconds()):
				v *= 1 + Probe*(since-float64(Settle.Milliseconds()))/float64(time.Minute.Milliseconds())
			}
			cur = int(min(v, math.MaxInt32))
			e.Learned[d] = cur
		}
		lim := lowest(ceiling, cur)
		if lim > 0 && e.Ramp < 1 {
			lim = max(int(float64(lim)*e.Ramp), 1)
		}
		e.PerMinute[d] = lim
		e.PerSecond[d] = perSecond(lim, c.burstFraction(), st.quantum(d, ms))
	}
	return e
}

// burstFraction is the share of the minute the per-second caps start at:
// BurstFraction, or the whole minute for a provider that limits input and
// output apart (Anthropic): it enforces a continuously refilled bucket,
// not a per-second window, and pacing at the minute's rate holds a bucket
// (a quarter-full second's cap of lumpy requests would waste up to half of
// it). A burst refusal still cuts the cap from there.
func (c Config) burstFraction() float64 {
	if c.SplitOutput {
		return 1
	}
	return c.BurstFraction
}

// quantum is the factor on dimension d's per-second cap at ms: 1 without a
// cut, else the cut's, recovering QuantumRecovery a minute after Settle.
func (st State) quantum(d int, ms int64) float64 {
	if st.Quantum[d] <= 0 {
		return 1
	}
	since := float64(ms-st.QuantumAt[d]) - float64(Settle.Milliseconds())
	return min(1, st.Quantum[d]+QuantumRecovery*max(since, 0)/float64(time.Minute.Milliseconds()))
}

// lowest is the smallest positive of a and b, or 0 when neither is.
func lowest(a, b int) int {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	}
	return min(a, b)
}

func perSecond(limit int, frac, q float64) int {
	if limit <= 0 {
		return 0
	}
	return max(int(math.Ceil(float64(limit)*frac*q-1e-9)), 1)
}

// Key is the KV key of a provider/model's record.
func Key(provider, modelToken string) string { return keys.Learn(provider, modelToken) }

// Store reads and updates records in the budgets bucket.
type Store struct {
	kv  budget.KV
	now func() time.Time
}

// NewStore makes a store; now may be nil for time.Now.
func NewStore(kv budget.KV, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{kv: kv, now: now}
}

// Get returns key's record (zero when none) and its revision (0 when none).
func (s *Store) Get(ctx context.Context, key string) (State, uint64, error) {
	var st State
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return st, 0, nil
	}
	if err != nil {
		return st, 0, fmt.Errorf("%w: get %s: %v", budget.ErrUnavailable, key, err)
	}
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		// A corrupt record teaches nothing: start over rather than stop.
		return State{}, e.Revision(), nil
	}
	return st, e.Revision(), nil
}

// Update applies fn to key's record under compare-and-set; fn returns false
// to leave it as it is. It returns the record after.
func (s *Store) Update(ctx context.Context, key string, fn func(*State) bool) (State, bool, error) {
	for range 20 {
		st, rev, err := s.Get(ctx, key)
		if err != nil {
			return st, false, err
		}
		if !fn(&st) {
			return st, false, nil
		}
		data, _ := json.Marshal(st)
		if rev == 0 {
			_, err = s.kv.Create(ctx, key, data)
		} else {
			_, err = s.kv.Update(ctx, key, data, rev)
		}
		if budget.IsConflict(err) {
			continue
		}
		if err != nil {
			return st, false, fmt.Errorf("%w: write %s: %v", budget.ErrUnavailable, key, err)
		}
		return st, true, nil
	}
	return State{}, false, fmt.Errorf("%w: %s: too many conflicts", budget.ErrUnavailable, key)
}

// Refusal is one 429 as an executor saw it.
type Refusal struct {
	Kind provider.RateLimitKind
	// Dim is Requests, Tokens, Output, or -1 when the provider did not say.
	Dim int
	// ReservedAt is when the refused call was planned; refusals of calls
	// planned before the last cut (plus EpochSlack) do not cut again.
	ReservedAt time.Time
	// RetryAfter is what the provider asked.
	RetryAfter time.Duration
	// Stated are per-minute limits the provider stated (<= 0: none).
	Stated [Dims]int
	// Used is what the fleet's window held in the minute when it came;
	// Recent what its schedule held in the second before the refused call
	// (zero when unknown); Cost what the refused call would have cost.
	Used, Recent, Cost budget.Cost
}

// Cut records a refusal: it returns whether it cut (and why), and the new
// record. The limits before the cut are computed from c at the store's now.
func (s *Store) Cut(ctx context.Context, key string, c Config, r Refusal) (bool, string, error) {
	if !c.Adapts || r.Kind == provider.LimitQuota {
		return false, "", nil
	}
	var reason string
	var cut bool
	_, _, err := s.Update(ctx, key, func(st *State) bool {
		now := s.now()
		ms := now.UnixMilli()
		reason, cut = "", false
		// A limit the provider states is adopted whatever the epoch.
		stated := st.adopt(r.Stated)
		if r.ReservedAt.UnixMilli() < st.Epoch+EpochSlack.Milliseconds() {
			if stated {
				reason, cut = "stated", true
			}
			return stated
		}
		before := Compute(c, *st, now)
		kind := r.Kind
		if kind == provider.LimitUnknown {
			kind = provider.LimitMinute
			if r.RetryAfter > 0 && r.RetryAfter <= HoldRamp {
				kind = provider.LimitBurst
			}
		}
		dims := []int{Requests, Tokens}
		if c.SplitOutput {
			dims = append(dims, Output)
		}
		if r.Dim >= Requests && r.Dim < Dims {
			dims = []int{r.Dim}
		}
		if kind == provider.LimitBurst && !stated && (st.BurstSeen == 0 || ms-st.BurstSeen > BurstConfirm.Milliseconds()) {
			st.BurstSeen = ms // noted: the next one within BurstConfirm cuts
			return true
		}
		switch kind {
		case provider.LimitBurst, provider.LimitConcurrency:
			for _, d := range dims {
				q := st.quantum(d, ms)
				nq := q * Beta
				// The provider refused with Recent already in its second
				// (which it had admitted), so its cap lies between Recent
				// and Recent plus this request: cut to the middle when that
				// is lower (one cut, not many, when the configuration is
				// far off), but never below a quarter in one epoch (the
				// fleet's view of the second is not the provider's).
				recent := [Dims]int{r.Recent.Requests, r.Recent.Tokens, r.Recent.Output}[d]
				own := [Dims]int{r.Cost.Requests, r.Cost.Tokens, r.Cost.Output}[d]
				if base := float64(before.PerSecond[d]) / max(q, 1e-9); recent > 0 && base > 0 {
					est := float64(recent)
					if d != Requests {
						est += float64(own) / 2
					}
					nq = max(min(nq, est/base), q/4)
				}
				st.Quantum[d], st.QuantumAt[d] = max(nq, 0.02), ms
			}
		case provider.LimitMinute:
			if stated {
				break // the stated limit is the cut
			}
			used := [Dims]int{r.Used.Requests, r.Used.Tokens, r.Used.Output}
			for _, d := range dims {
				// An unlimited dimension refused per minute learns a limit
				// too: hammering on would only buy more refusals.
				cur := before.PerMinute[d]
				v := used[d]
				if cur > 0 {
					v = min(v, cur)
				}
				if v <= 0 {
					v = cur
				}
				st.Learned[d] = max(int(float64(v)*MinuteMargin), 1)
				st.LearnedAt[d], st.Discovering[d] = ms, false
			}
		case provider.LimitAcceleration:
			st.RampFrom = ms
		}
		if r.RetryAfter >= HoldRamp {
			st.RampFrom = max(st.RampFrom, now.Add(r.RetryAfter).UnixMilli())
		}
		st.Epoch, st.Cuts, st.BurstSeen = ms, st.Cuts+1, 0
		reason, cut = string(kind), true
		if stated {
			reason = "stated"
		}
		st.LastReason = reason
		return true
	})
	return cut && err == nil, reason, err
}

// configured is c's per-minute limit of dimension d.
func (c Config) configured(d int) int { return [Dims]int{c.RPM, c.TPM, c.OTPM}[d] }

// Observe records limits a successful response stated; it writes only
// when they differ from the record.
func (s *Store) Observe(ctx context.Context, key string, c Config, stated [Dims]int) error {
	if !c.Adapts || (stated[0] <= 0 && stated[1] <= 0) {
		return nil
	}
	_, _, err := s.Update(ctx, key, func(st *State) bool { return st.adopt(stated) })
	return err
}

// adopt records the limits a provider stated (> 0) and ends the discovery
// of a limit it stated (nothing is left to discover); it reports whether
// the record changed.
func (st *State) adopt(stated [Dims]int) bool {
	changed := false
	for d := range Dims {
		if v := stated[d]; v > 0 && v != st.Stated[d] {
			st.Stated[d], changed = v, true
		}
		if stated[d] > 0 && st.Discovering[d] {
			st.Learned[d], st.LearnedAt[d], st.Discovering[d] = 0, 0, false
			changed = true
		}
	}
	return changed
}

// Start prepares a model's record when it has none: a warm-up, and the
// starting point of discovered limits. A model with a record starts from
// it (a restarted fleet starts warm).
func (s *Store) Start(ctx context.Context, key string, c Config) (State, error) {
	st, _, err := s.Update(ctx, key, func(st *State) bool {
		if st.Epoch != 0 || st.RampFrom != 0 || st.Learned != [Dims]int{} || st.Stated != [Dims]int{} {
			return false
		}
		ms := s.now().UnixMilli()
		started := false
		if !c.NoWarmUp {
			st.RampFrom, started = ms, true
		}
		if c.Discovers {
			for d := range Dims {
				if c.configured(d) == 0 && (d != Output || c.SplitOutput) {
					st.Learned[d], st.LearnedAt[d], st.Discovering[d] = DiscoverStart[d], ms, true
					started = true
				}
			}
		}
		return started
	})
	return st, err
}
