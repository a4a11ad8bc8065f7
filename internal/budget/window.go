// Package budget keeps the rate budgets that every Sluice process shares in
// the budgets KV bucket: windows of requests, tokens and up to MaxUnits other
// units, the paced send schedule of each provider/model, the leases through
// which a process spends them locally, and the fleet-wide concurrency slots.
//
// # Dimensions
//
// A window counts every dimension the same way: requests, tokens and a
// key's units (images, audio seconds, tasks: whatever a model's
// configuration names) are entries of one fixed-size vector, and the
// pacing, the per-second quantum, the minute and the leases apply to each
// entry alike. Cost and Limits name requests and tokens for their callers
// and carry the units by index (a model's units in the order of their
// names); the windows store vectors, as JSON arrays without their trailing
// zeros, so a window without units reads as one whose units are zero. A key
// limited on input and output apart (Anthropic) counts output in one more
// entry, last.
//
// # Windows
//
// A [Store] keeps one [Window] per key and changes it only by
// compare-and-set. Time is cut into slices (250 ms by default), and a window
// records, per slice, what was reserved in it. On a plain store (tenant
// budgets per minute, and per-day windows with one-minute slices) a
// reservation made in slice k may start its call until the end of slice k
// plus a dispatch grace g, and the check sums the last Span =
// ceil((window+g)/slice)+1 slices, so no trailing window ever holds more
// than the limit whatever the dispatch delays. A paced store (Params.Short >
// 0: every provider/model) also plans, for each reservation, the instant its
// call may leave (Grant.SendAt) on one shared schedule; pace.go states the
// rules and why the provider then never sees more than the limits in any
// window it enforces.
//
// # Leases
//
// A [Lease] is one process's share of a window: [Lease.Take] places the jobs
// a process holds and room for its expected demand with one
// compare-and-set, the room stays in the process as blocks that jobs spend
// locally ([Lease.Spend]), and a block's leftover goes back to the window
// when it can no longer be spent ([Lease.Expire]). So the KV is touched a few
// times a second per key, not per job. [LeadEstimator] learns how far ahead
// of now a paced plan starts, from the transits executors report.
//
// # One owner per schedule
//
// With [Owners] set, a paced store's writes ([Op]) go to the process that
// owns the schedule, which applies many in one compare-and-set (owner.go);
// the KV stays the truth, and without an owner a store writes it itself.
//
// # The ledger
//
// Reserve, settle and give back have one owner, this package (ledger.go):
// a [Rule] per provider kind (config.Model.Rule) counts a reservation's
// parts ([Held]: its slice, prompt, cached part, output and units) on the
// schedule's dimensions; admission places through it, the guard bounds a
// reservation by it ([Rule.Check]) and executors settle and give back
// through a [Ledger], which chooses among [Store.Settle] (a larger count),
// [Store.ReturnAt] (what was planned and not charged),
// [Store.ReturnLapsed] (an instant an executor let lapse) and
// [Store.ReturnRewind] (a provider that refills a bucket). On a provider
// with one token limit output is not refunded: it charges prompt +
// max_tokens at arrival.
//
// # Concurrency
//
// A [Pool] holds one executor process's lease on a model's call slots
// (ConcKey): renewed with one compare-and-set every third of its period,
// sized to recent use plus a spare, capped at an equal share when holders
// compete. The unexpired leases never add up to more than the limit.
package budget

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	jsonv1 "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
)

// MaxUnits is how many units besides requests and tokens one key may
// limit.
const MaxUnits = 4

// dims is how many dimensions a window counts: requests, tokens, units,
// output tokens.
const dims = 3 + MaxUnits

// outDim is the output tokens' dimension: limited apart from the tokens
// dimension on providers that limit input and output tokens apart
// (Anthropic's ITPM and OTPM; the tokens dimension is then the input).
// Last, so a window stored without it reads as one whose output is zero.
const outDim = 2 + MaxUnits

// Vec is an amount in every dimension of a window: [0] requests, [1]
// tokens, [2+i] unit i, [2+MaxUnits] output tokens.
type Vec [dims]int64

func (v *Vec) add(o Vec) {
	for d := range v {
		v[d] += o[d]
	}
}

// take subtracts o from v.
func (v *Vec) take(o Vec) {
	for d := range v {
		v[d] -= o[d]
	}
}

// sub takes o's positive entries from v, never below zero.
func (v *Vec) sub(o Vec) {
	for d := range v {
		v[d] = max(v[d]-max(o[d], 0), 0)
	}
}

// any reports whether some dimension is positive.
func (v Vec) any() bool {
	for _, x := range v {
		if x > 0 {
			return true
		}
	}
	return false
}

// Limits are the limits of one key, per minute unless the store has
// another Window. Zero means unlimited.
type Limits struct {
	// RPM and TPM are requests and tokens per the store's Window (a
	// minute unless Params.Window says otherwise; see PerWindow).
	RPM int
	TPM int
	// Units are the per-minute limits of the key's other units, by index
	// (0: unlimited).
	Units [MaxUnits]int
	// OTPM limits output tokens apart (0: unlimited); TPM then limits the
	// input (Anthropic's ITPM).
	OTPM int
	// Keep is a share of both windows (the minute and the burst second) a
	// reservation must leave free: room held back for work that should not
	// wait behind a backlog. KeepAtLeast is the least room kept in each
	// window when Keep > 0 (a fraction of a small per-second cap can be less
	// than one job), but never more than a tenth of the window: a job that
	// is most of a window is not worth idling a backlog for. Zero keeps
	// nothing.
	Keep        float64
	KeepAtLeast Cost
	// BurstRequests and BurstTokens, when > 0, are the per-second caps
	// instead of the ones BurstFraction derives from the minute limits (a
	// quantum learned from the provider's 429s). Units always use
	// BurstFraction (they are not learned from the provider).
	BurstRequests, BurstTokens int
	// BurstOutput, when > 0, is the per-second cap on output tokens.
	BurstOutput int
	// OutputTolerance, when > 0, lets the output tokens' pace run this far
	// ahead of its average (a burst tolerance, in time at the OTPM rate),
	// for a provider that charges max_tokens at arrival from a bucket that
	// holds a minute's worth and gives back what the answer did not use
	// (Anthropic's OTPM): calls in flight hold their whole max_tokens until
	// they end, and without it the schedule would pace them at their
	// latency instead of at what they use. The minute's output bound is
	// raised by as much (pace.go).
	OutputTolerance time.Duration
	// Horizon, when > 0, bounds how far ahead a paced store plans these
	// costs instead of Params.Horizon (backlogs plan a short way ahead, so
	// work that should not wait is not queued behind their placements).
	Horizon time.Duration
}

// minute returns the per-minute limits as a vector (0: unlimited).
func (lim Limits) minute() Vec {
	v := Vec{int64(lim.RPM), int64(lim.TPM)}
	for i, u := range lim.Units {
		v[2+i] = int64(u)
	}
	v[outDim] = int64(lim.OTPM)
	return v
}

// Limited reports whether any dimension has a limit.
func (lim Limits) Limited() bool { return lim.minute().any() }

// caps returns the effective per-minute limits (0: unlimited) and
// per-second caps (math.MaxInt64: none) of every dimension, after the room
// kept.
func (lim Limits) caps(frac float64) (mins, caps Vec) {
	mins = lim.minute()
	least := lim.KeepAtLeast.vec()
	for d, limit := range mins {
		caps[d] = burstCap(int(limit), frac)
		if lim.Keep > 0 && limit > 0 {
			keep := func(limit int64) int64 {
				share := int64(math.Ceil(float64(limit) * lim.Keep))
				return max(share, min(least[d], limit/10))
			}
			mins[d] = max(limit-keep(limit), 1)
			caps[d] -= keep(caps[d])
		}
	}
	// A quantum learned from the provider replaces the derived cap.
	if lim.BurstRequests > 0 && mins[0] > 0 {
		caps[0] = int64(lim.BurstRequests)
	}
	if lim.BurstTokens > 0 && mins[1] > 0 {
		caps[1] = int64(lim.BurstTokens)
	}
	if lim.BurstOutput > 0 && mins[outDim] > 0 {
		caps[outDim] = int64(lim.BurstOutput)
	}
	return mins, caps
}

// Cost is what one job reserves.
type Cost struct {
	Requests int
	Tokens   int
	// Units are amounts of the key's other units, by index (the indices
	// of Limits.Units).
	Units [MaxUnits]int
	// Output is the output tokens charged apart (Limits.OTPM).
	Output int
}

func (c Cost) vec() Vec {
	v := Vec{int64(c.Requests), int64(c.Tokens)}
	for i, u := range c.Units {
		v[2+i] = int64(u)
	}
	v[outDim] = int64(c.Output)
	return v
}

func costOf(v Vec) Cost {
	c := Cost{Requests: int(v[0]), Tokens: int(v[1]), Output: int(v[outDim])}
	for i := range c.Units {
		c.Units[i] = int(v[2+i])
	}
	return c
}

// Plus returns c + o in every dimension.
func (c Cost) Plus(o Cost) Cost {
	c.Requests += o.Requests
	c.Tokens += o.Tokens
	c.Output += o.Output
	for i := range c.Units {
		c.Units[i] += o.Units[i]
	}
	return c
}

// Minus returns c - o in every dimension.
func (c Cost) Minus(o Cost) Cost {
	c.Requests -= o.Requests
	c.Tokens -= o.Tokens
	c.Output -= o.Output
	for i := range c.Units {
		c.Units[i] -= o.Units[i]
	}
	return c
}

// Positive reports whether some dimension is above zero.
func (c Cost) Positive() bool { return c.vec().any() }

// Within reports whether c is at most room in every dimension.
func (c Cost) Within(room Cost) bool {
	if c.Requests > room.Requests || c.Tokens > room.Tokens || c.Output > room.Output {
		return false
	}
	for i, u := range c.Units {
		if u > room.Units[i] {
			return false
		}
	}
	return true
}

// Params shape the windows. They must be the same in every process.
type Params struct {
	// Window is the period the limits apply to; 0 means one minute.
	Window        time.Duration
	Slice         time.Duration
	DispatchGrace time.Duration
	BurstFraction float64
	// Short > 0 makes the store paced (see pace.go): every reservation gets
	// the instant its call may leave, at least Lead from now (Store.Lead's,
	// when set: lead.go) and at most Horizon ahead, and is valid until Tolerance after that instant; Short
	// is the window the per-second caps apply to (one second). A paced
	// store's minute sums Window + Tolerance instead of + DispatchGrace.
	Short, Lead, Tolerance, Horizon time.Duration
}

// Span is the number of slices a window sums.
func (p Params) Span() int64 {
	w := p.Window
	if w == 0 {
		w = time.Minute
	}
	grace := p.DispatchGrace
	if p.paced() {
		grace = p.Tolerance
	}
	return int64(math.Ceil(float64(w+grace)/float64(p.Slice))) + 1
}

func (p Params) burstSlices() int64 {
	n := int64(time.Second / p.Slice)
	if n < 1 {
		n = 1
	}
	return n
}

// Window is the shared state of one key: usage per slice index, in every
// dimension ([0] requests, [1] tokens, [2+i] unit i).
//
// Its JSON is {"s": {"<slice>": [requests, tokens, units...]}, "p":
// [{"a": at, "r": requests, "t": tokens, "u": [units...]}], "tat": [...],
// "last": at}; trailing zero units are left out, so a window without units
// reads and writes as it did before units existed, and one written with
// them loses only its units when an older process reads it.
type Window struct {
	Slices map[int64]Vec
	// Paced stores only: the placements of the last short window and those
	// ahead, in time order; the theoretical arrival time of each dimension
	// (unix microseconds); the newest placement.
	P    []planned
	TAT  Vec
	Last int64
	// Ends (paced stores) is, per slice charged only by placements, the
	// whole milliseconds from the slice's start to its latest placement:
	// the slice leaves the minute when that instant does, not when the
	// slice ends. A slice without one (charged at an unknown instant, or
	// by a version before Ends) counts whole.
	Ends map[int64]int64
}

// Grant is the result of Take.
type Grant struct {
	N          int       // how many costs, from the front, were reserved
	Slice      int64     // the slice they were reserved in
	ValidUntil time.Time // the latest start of their provider calls
	// RetryAt is when the first cost not granted may fit (zero when all fit).
	RetryAt time.Time
	// Reason says what bound first: "rpm", "tpm", "burst" or "" when all fit.
	Reason string
	// SendAt is, on a paced store, the instant each granted cost may be
	// sent (its call is valid until Tolerance after it); ValidUntil is then
	// the last one's.
	SendAt []time.Time
	// From is, for each instant of SendAt, the earliest moment its call may
	// leave: the instant itself, or, where the schedule has room for the
	// call over the lead before it too (Store.roomy), the moment the grant
	// was planned, so a model far from its limits adds no wait.
	From []time.Time
	// Planned is the instant the grant was computed at: a paced store's
	// instants are at least its lead after it, so a call's dispatch
	// transit runs from here (the read of the window before it is not
	// transit).
	Planned time.Time
}

// KV is the part of a jetstream.KeyValue the store uses.
type KV interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
}

// Store reserves budget in a KV bucket.
type Store struct {
	kv     KV
	p      Params
	now    func() time.Time
	Writes func() // called after each successful write, for metrics; may be nil
	// Conflicts is called on a lost compare-and-set; may be nil.
	Conflicts func()
	// Sleep waits d or until ctx ends, between lost compare-and-sets
	// (backoff.go); nil uses a timer. Tests replace it.
	Sleep func(ctx context.Context, d time.Duration) error
	// Lead, when set, is how far ahead of now a paced store plans at the
	// earliest (learned: lead.go); nil plans Params.Lead ahead.
	Lead func(now time.Time) time.Duration
	// Owners, when set, sends the writes of a paced store's schedules to
	// their owners (owner.go); nil: this process writes the KV itself.
	Owners *Owners

	known knownWindows // known.go
}

// NewStore makes a store; now may be nil for time.Now.
func NewStore(kv KV, p Params, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{kv: kv, p: p, now: now}
}

// Params returns the store's parameters.
func (s *Store) Params() Params { return s.p }

// ErrUnavailable wraps failures to reach the budget store: callers must not
// dispatch without budget (fail closed).
var ErrUnavailable = errors.New("budget store unavailable")

func (s *Store) sliceOf(t time.Time) int64 { return t.UnixNano() / int64(s.p.Slice) }

func (s *Store) sliceStart(k int64) time.Time { return time.Unix(0, k*int64(s.p.Slice)) }

// Take reserves the longest prefix of costs that fits key's limits now, with
// one compare-and-set (retried on conflict, after a backoff: backoff.go).
func (s *Store) Take(ctx context.Context, key string, lim Limits, costs []Cost) (Grant, error) {
	return s.TakeAt(ctx, key, lim, costs, nil)
}

// TakeAt is Take where, on a paced store, cost i is placed no earlier than
// notBefore[i] (when given and not zero): room for demand expected later
// in a slice, say.
func (s *Store) TakeAt(ctx context.Context, key string, lim Limits, costs []Cost, notBefore []time.Time) (Grant, error) {
	o := &Op{Kind: OpTake, Lim: lim, Costs: costs, NotBefore: notBefore}
	if s.p.paced() {
		o.Lead = s.lead(s.now())
		if done, err := s.routed(ctx, key, o); done {
			return granted(o, err)
		}
	}
	return granted(o, s.applyAll(ctx, key, []*Op{o}))
}

// granted is a take's result: nothing granted when the write failed.
func granted(o *Op, err error) (Grant, error) {
	if err != nil {
		return Grant{}, err
	}
	return o.Grant, nil
}

// Settle charges extra tokens to the slice a reservation was made in (the
// provider counted more than was reserved). Extra <= 0 does nothing.
func (s *Store) Settle(ctx context.Context, key string, slice int64, extra Cost) error {
	if !extra.Positive() {
		return nil
	}
	return s.SettleAll(ctx, key, []Settlement{{Slice: slice, Extra: extra}})
}

// charge adds extra's positive entries to slice and reports whether w
// changed (not when the slice is already out of every window).
func (s *Store) charge(w *Window, cur, slice int64, extra Cost) bool {
	if slice < cur-s.p.Span()+1 {
		return false
	}
	v := w.Slices[slice]
	for d, x := range extra.vec() {
		v[d] += max(x, 0)
	}
	w.Slices[slice] = v
	delete(w.Ends, slice) // charged at an instant the window does not know
	return true
}

// modify applies fn to key's window (pruned to the current slice cur)
// under compare-and-set, retrying on conflict after a backoff (backoff.go);
// fn returns false to write nothing.
func (s *Store) modify(ctx context.Context, key, what string, fn func(w *Window, cur int64) bool) error {
	b := s.backoff()
	for {
		w, rev, err := s.load(ctx, key)
		if err != nil {
			return err
		}
		now := s.now()
		cur := s.sliceOf(now)
		w.prune(cur - s.p.Span() + 1)
		if s.p.paced() {
			s.prunePlanned(&w, now)
		}
		if !fn(&w, cur) {
			return nil
		}
		rev, err = s.store(ctx, key, w, rev)
		if err == nil {
			s.known.refresh(key, w, rev)
		}
		if errors.Is(err, errConflict) {
			if s.Conflicts != nil {
				s.Conflicts()
			}
			if err := b.wait(ctx, what, key); err != nil {
				return err
			}
			continue
		}
		return err
	}
}

// Used returns what key's window holds now in every dimension (for
// visibility).
func (s *Store) Used(ctx context.Context, key string) (Cost, error) {
	w, _, err := s.load(ctx, key)
	if err != nil {
		return Cost{}, err
	}
	cur := s.sliceOf(s.now())
	w.prune(cur - s.p.Span() + 1)
	return costOf(w.sum(math.MinInt64)), nil
}

// plan grants costs in order and records them in w's current slice.
func (s *Store) plan(w *Window, lim Limits, costs []Cost, cur int64) Grant {
	used := w.sum(math.MinInt64)
	burst := w.sum(cur - s.p.burstSlices() + 1)
	mins, caps := lim.caps(s.p.BurstFraction)
	g := Grant{Slice: cur, ValidUntil: s.sliceStart(cur + 1).Add(s.p.DispatchGrace)}
	var added Vec
	for _, c := range costs {
		v := c.vec()
		// The minute limits first (requests, tokens, units), then the
		// per-second caps.
		for d := range v {
			if mins[d] > 0 && used[d]+added[d]+v[d] > mins[d] {
				g.Reason = reasonOf(d)
				break
			}
		}
		for d := range v {
			if g.Reason == "" && mins[d] > 0 && burst[d]+added[d] > 0 && burst[d]+added[d]+v[d] > caps[d] {
				g.Reason = "burst"
			}
		}
		if g.Reason != "" {
			g.RetryAt = s.retryAt(w, lim, v, cur, added, g.Reason)
			break
		}
		added.add(v)
		g.N++
	}
	if g.N > 0 {
		v := w.Slices[cur]
		v.add(added)
		w.Slices[cur] = v
	}
	return g
}

// reasonOf names the minute limit of dimension d in a Grant's Reason.
func reasonOf(d int) string {
	switch d {
	case 0:
		return "rpm"
	case 1:
		return "tpm"
	case outDim:
		return "otpm"
	}
	return "units"
}

// retryAt finds when cost c could fit: for the minute limits, the end of the
// window of the oldest slices that must expire; for the burst cap, the next
// slice.
func (s *Store) retryAt(w *Window, lim Limits, c Vec, cur int64, added Vec, reason string) time.Time {
	next := s.sliceStart(cur + 1)
	if reason == "burst" {
		return next
	}
	used := w.sum(math.MinInt64)
	mins, _ := lim.caps(s.p.BurstFraction)
	var need Vec
	for d := range need {
		if mins[d] > 0 {
			need[d] = used[d] + added[d] + c[d] - mins[d]
		}
	}
	var freed Vec
	covered := func() bool {
		for d := range need {
			if freed[d] < need[d] {
				return false
			}
		}
		return true
	}
	for _, k := range w.keys() {
		if covered() {
			break
		}
		freed.add(w.Slices[k])
		// slice k leaves the window when the current slice is k+Span.
		next = s.sliceStart(k + s.p.Span())
	}
	if !covered() {
		// The cost exceeds the limit even with an empty window; admission
		// rejects such jobs before they get here. Retry in a full window.
		return s.sliceStart(cur + s.p.Span())
	}
	return next
}

func burstCap(limit int, frac float64) int64 {
	if limit <= 0 {
		return math.MaxInt64
	}
	return max(int64(math.Ceil(float64(limit)*frac)), 1)
}

func (w *Window) prune(from int64) {
	for k := range w.Slices {
		if k < from {
			delete(w.Slices, k)
		}
	}
	for k := range w.Ends {
		if k < from {
			delete(w.Ends, k)
		}
	}
}

func (w *Window) sum(from int64) (sum Vec) {
	for k, v := range w.Slices {
		if k >= from {
			sum.add(v)
		}
	}
	return sum
}

func (w *Window) keys() []int64 {
	ks := make([]int64, 0, len(w.Slices))
	for k := range w.Slices {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

var errConflict = errors.New("budget: revision conflict")

func (s *Store) load(ctx context.Context, key string) (Window, uint64, error) {
	w := Window{Slices: map[int64]Vec{}}
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return w, 0, nil
	}
	if err != nil {
		return w, 0, fmt.Errorf("%w: get %s: %v", ErrUnavailable, key, err)
	}
	if len(e.Value()) > 0 {
		if err := w.UnmarshalJSON(e.Value()); err != nil {
			return w, 0, fmt.Errorf("budget %s: corrupt window: %w", key, err)
		}
	}
	return w, e.Revision(), nil
}

// windowJSON is a window's stored form (see Window). A JSON array decoded
// into a longer Go array leaves the rest zero, and a longer one into a
// shorter loses its tail: windows stored with fewer dimensions read as
// windows whose other dimensions are zero.
type windowJSON struct {
	S    map[string]Vec   `json:"s"`
	P    []plannedJSON    `json:"p,omitempty"`
	TAT  Vec              `json:"tat"`
	Last int64            `json:"last,omitempty"`
	E    map[string]int64 `json:"e,omitempty"`
}

type plannedJSON struct {
	At int64   `json:"a"`
	R  int64   `json:"r"`
	T  int64   `json:"t"`
	U  []int64 `json:"u,omitempty"`
}

// UnmarshalJSON reads a stored window. It decodes with go-json-experiment's
// v1 API (encoding/json's semantics, TestWindowDecodesAsStd): a window is read
// at every owner's batch and every compare-and-set retry.
func (w *Window) UnmarshalJSON(data []byte) error {
	var raw windowJSON
	if err := jsonv1.Unmarshal(data, &raw); err != nil {
		return err
	}
	return w.fromJSON(raw)
}

// fromJSON sets w from its decoded stored form.
func (w *Window) fromJSON(raw windowJSON) error {
	if w.Slices == nil {
		w.Slices = make(map[int64]Vec, len(raw.S))
	}
	for k, v := range raw.S {
		n, err := strconv.ParseInt(k, 10, 64)
		if err != nil {
			return fmt.Errorf("corrupt slice %q", k)
		}
		w.Slices[n] = v
	}
	w.P = make([]planned, len(raw.P))
	for i, p := range raw.P {
		w.P[i] = planned{At: p.At, V: Vec{p.R, p.T}}
		copy(w.P[i].V[2:], p.U)
	}
	w.TAT, w.Last = raw.TAT, raw.Last
	if len(raw.E) > 0 {
		w.Ends = make(map[int64]int64, len(raw.E))
	}
	for k, v := range raw.E {
		n, err := strconv.ParseInt(k, 10, 64)
		if err != nil {
			return fmt.Errorf("corrupt slice end %q", k)
		}
		w.Ends[n] = v
	}
	return nil
}

// MarshalJSON writes the stored form by hand: it is written at every
// compare-and-set, and trailing zeros are left out of every vector.
func (w Window) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 64+len(w.Slices)*32+len(w.P)*40)
	b = append(b, `{"s":`...)
	b = appendObject(b, w.Slices, func(b []byte, v Vec) []byte { return appendVec(b, v[:], 2) })
	if len(w.P) > 0 {
		b = append(b, `,"p":[`...)
		for i, p := range w.P {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"a":`...)
			b = strconv.AppendInt(b, p.At, 10)
			b = append(b, `,"r":`...)
			b = strconv.AppendInt(b, p.V[0], 10)
			b = append(b, `,"t":`...)
			b = strconv.AppendInt(b, p.V[1], 10)
			if p.V.any2() {
				b = append(b, `,"u":`...)
				b = appendVec(b, p.V[2:], 1)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if w.TAT != (Vec{}) {
		b = append(b, `,"tat":`...)
		b = appendVec(b, w.TAT[:], 2)
	}
	if w.Last != 0 {
		b = append(b, `,"last":`...)
		b = strconv.AppendInt(b, w.Last, 10)
	}
	if len(w.Ends) > 0 {
		b = append(b, `,"e":`...)
		b = appendObject(b, w.Ends, func(b []byte, v int64) []byte { return strconv.AppendInt(b, v, 10) })
	}
	return append(b, '}'), nil
}

// appendObject appends m as a JSON object, in map order, its keys in
// decimal and each value as val appends it.
func appendObject[V any](b []byte, m map[int64]V, val func([]byte, V) []byte) []byte {
	b = append(b, '{')
	first := true
	for k, v := range m {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, '"')
		b = strconv.AppendInt(b, k, 10)
		b = append(b, `":`...)
		b = val(b, v)
	}
	return append(b, '}')
}

// any2 reports whether some unit (a dimension after requests and tokens)
// is not zero.
func (v Vec) any2() bool {
	for _, x := range v[2:] {
		if x != 0 {
			return true
		}
	}
	return false
}

// appendVec appends v as a JSON array without its trailing zeros, but at
// least least entries.
func appendVec(b []byte, v []int64, least int) []byte {
	n := len(v)
	for n > least && v[n-1] == 0 {
		n--
	}
	b = append(b, '[')
	for i, x := range v[:n] {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, x, 10)
	}
	return append(b, ']')
}

// store writes w as key's window if it is still at revision rev (0: the
// key does not exist), and returns the revision written.
func (s *Store) store(ctx context.Context, key string, w Window, rev uint64) (uint64, error) {
	data, err := w.MarshalJSON()
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		rev, err = s.kv.Create(ctx, key, data)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, errConflict
		}
	} else {
		rev, err = s.kv.Update(ctx, key, data, rev)
		if IsConflict(err) {
			return 0, errConflict
		}
	}
	if err != nil {
		return 0, fmt.Errorf("%w: write %s: %v", ErrUnavailable, key, err)
	}
	if s.Writes != nil {
		s.Writes()
	}
	return rev, nil
}

// IsConflict reports a lost compare-and-set on a KV key.
func IsConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// ModelKey is the budgets key of a provider/model.
func ModelKey(provider, modelToken string) string { return keys.Rate(provider, modelToken) }

// Charge adds cost to key's current slice (the provider reported less room
// than the shared view believed). It only ever lowers what is available.
func (s *Store) Charge(ctx context.Context, key string, extra Cost) error {
	return s.Settle(ctx, key, s.sliceOf(s.now()), extra)
}

// PerWindow is the limits of a store whose Window is not a minute (the
// per-day stores): requests and tokens per that window.
func PerWindow(requests, tokens int) Limits { return Limits{RPM: requests, TPM: tokens} }

// Return gives back cost reserved in slice and not spent (a lease's
// leftover). Usage never goes below zero; a slice already out of every
// window is left alone.
func (s *Store) Return(ctx context.Context, key string, slice int64, c Cost) error {
	if !c.Positive() {
		return nil
	}
	return s.modify(ctx, key, "return", func(w *Window, cur int64) bool {
		if slice < cur-s.p.Span()+1 {
			return false
		}
		v, ok := w.Slices[slice]
		if !ok {
			return false
		}
		v.sub(c.vec())
		w.Slices[slice] = v
		return true
	})
}

// SliceOf returns the slice index of t.
func (s *Store) SliceOf(t time.Time) int64 { return s.sliceOf(t) }

// ValidUntil returns the latest start of a call reserved in slice k.
func (s *Store) ValidUntil(k int64) time.Time { return s.sliceStart(k + 1).Add(s.p.DispatchGrace) }
