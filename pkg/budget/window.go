// Package budget keeps the rate budgets (requests and tokens per minute) that
// every Sluice process shares, in the budgets KV bucket.
//
// # The model
//
// Time is cut into slices (250 ms by default). A shared window per
// provider/model records, per slice, the requests and tokens reserved in it.
// A reservation made in slice k may start its provider call until the end of
// slice k plus a dispatch grace g (the executor enforces this and sends a late
// job back for a new reservation). Two reservations made in slices k1 < k2 can
// therefore both reach the provider inside one 60-s window only if
// k2-k1 < (60s+g)/d + 1, so the check sums the last Span = ceil((60s+g)/d)+1
// slices: whatever the dispatch delays, the provider never sees more than the
// limit in any trailing 60 s. Steady-state throughput is limit·60/(Span·d),
// 98.0 % with the defaults (60 s / (245 × 250 ms)).
//
// A second cap bounds what the last second of slices may take
// (BurstFraction of the per-minute limit), because providers also enforce
// limits over shorter periods; a request alone in its second is always
// allowed if the minute has room, so a request larger than the cap still runs.
//
// # Leases, not per-job round trips
//
// Take reserves a whole batch of jobs (an ordered list of costs) with one
// compare-and-set and grants the longest prefix that fits. Admission fetches
// jobs in batches, so KV writes per job fall as load rises. Nothing is handed
// back after the call: providers charge prompt + max_tokens at arrival
// (OpenAI documents this), so refunding the unused output would let the
// shared view drift below what the provider counts. When the provider
// reports more prompt tokens than estimated, Settle charges the difference.
package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Limits are the per-minute limits of one key. Zero means unlimited.
type Limits struct {
	RPM int
	TPM int
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
	// quantum learned from the provider's 429s).
	BurstRequests, BurstTokens int
	// Horizon, when > 0, bounds how far ahead a paced store plans these
	// costs instead of Params.Horizon (backlogs plan a short way ahead, so
	// work that should not wait is not queued behind their placements).
	Horizon time.Duration
}

// caps returns the effective per-minute limits and per-second caps, after
// the room kept; 0 means unlimited for the minute limits.
func (lim Limits) caps(frac float64) (minR, minT, capR, capT int64) {
	minR, minT = int64(lim.RPM), int64(lim.TPM)
	capR, capT = burstCap(lim.RPM, frac), burstCap(lim.TPM, frac)
	if lim.Keep <= 0 {
		return
	}
	keep := func(limit int64, least int) int64 {
		share := int64(math.Ceil(float64(limit) * lim.Keep))
		return max(share, min(int64(least), limit/10))
	}
	if lim.RPM > 0 {
		minR = max(minR-keep(minR, lim.KeepAtLeast.Requests), 1)
		capR -= keep(capR, lim.KeepAtLeast.Requests)
	}
	if lim.TPM > 0 {
		minT = max(minT-keep(minT, lim.KeepAtLeast.Tokens), 1)
		capT -= keep(capT, lim.KeepAtLeast.Tokens)
	}
	return
}

// Cost is what one job reserves.
type Cost struct {
	Requests int
	Tokens   int
}

// Params shape the windows. They must be the same in every process.
type Params struct {
	// Window is the period the limits apply to; 0 means one minute.
	Window        time.Duration
	Slice         time.Duration
	DispatchGrace time.Duration
	BurstFraction float64
	// Short > 0 makes the store paced (see pace.go): every reservation gets
	// the instant its call may leave, at least Lead from now and at most
	// Horizon ahead, and is valid until Tolerance after that instant; Short
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

// Window is the shared state of one key: usage per slice index.
type Window struct {
	Slices map[int64][2]int64 `json:"s"`
	// Paced stores only: the placements of the last short window and those
	// ahead, in time order; the theoretical arrival time of requests and
	// tokens (unix microseconds); the newest placement.
	P    []planned `json:"p,omitempty"`
	TAT  [2]int64  `json:"tat,omitzero"`
	Last int64     `json:"last,omitempty"`
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
// one compare-and-set (retried on conflict).
func (s *Store) Take(ctx context.Context, key string, lim Limits, costs []Cost) (Grant, error) {
	return s.TakeAt(ctx, key, lim, costs, nil)
}

// TakeAt is Take where, on a paced store, cost i is placed no earlier than
// notBefore[i] (when given and not zero): room for demand expected later
// in a slice, say.
func (s *Store) TakeAt(ctx context.Context, key string, lim Limits, costs []Cost, notBefore []time.Time) (Grant, error) {
	for attempt := 0; ; attempt++ {
		w, rev, err := s.load(ctx, key)
		if err != nil {
			return Grant{}, err
		}
		now := s.now()
		cur := s.sliceOf(now)
		w.prune(cur - s.p.Span() + 1)
		var g Grant
		if s.p.paced() {
			s.prunePlanned(&w, now)
			g = s.place(&w, lim, costs, notBefore, now)
		} else {
			g = s.plan(&w, lim, costs, cur)
		}
		if g.N == 0 {
			return g, nil
		}
		if err := s.store(ctx, key, w, rev); err != nil {
			if errors.Is(err, errConflict) {
				if s.Conflicts != nil {
					s.Conflicts()
				}
				if attempt < maxAttempts-1 {
					continue
				}
				return Grant{}, fmt.Errorf("%w: take %s: lost %d compare-and-sets in a row", ErrUnavailable, key, maxAttempts)
			}
			return Grant{}, err
		}
		return g, nil
	}
}

// Settle charges extra tokens to the slice a reservation was made in (the
// provider counted more than was reserved). Extra <= 0 does nothing.
func (s *Store) Settle(ctx context.Context, key string, slice int64, extra Cost) error {
	if extra.Requests <= 0 && extra.Tokens <= 0 {
		return nil
	}
	return s.modify(ctx, key, "settle", func(w *Window, cur int64) bool {
		if slice < cur-s.p.Span()+1 {
			return false // already out of every window
		}
		v := w.Slices[slice]
		v[0] += int64(max(extra.Requests, 0))
		v[1] += int64(max(extra.Tokens, 0))
		w.Slices[slice] = v
		return true
	})
}

// modify applies fn to key's window (pruned to the current slice cur)
// under compare-and-set, retrying on conflict; fn returns false to write
// nothing.
func (s *Store) modify(ctx context.Context, key, what string, fn func(w *Window, cur int64) bool) error {
	for range maxAttempts {
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
		err = s.store(ctx, key, w, rev)
		if errors.Is(err, errConflict) {
			if s.Conflicts != nil {
				s.Conflicts()
			}
			continue
		}
		return err
	}
	return fmt.Errorf("%w: %s %s: lost %d compare-and-sets in a row", ErrUnavailable, what, key, maxAttempts)
}

// Used returns the requests and tokens in key's window now (for visibility).
func (s *Store) Used(ctx context.Context, key string) (Cost, error) {
	w, _, err := s.load(ctx, key)
	if err != nil {
		return Cost{}, err
	}
	cur := s.sliceOf(s.now())
	w.prune(cur - s.p.Span() + 1)
	r, t := w.sum(math.MinInt64)
	return Cost{Requests: int(r), Tokens: int(t)}, nil
}

// plan grants costs in order and records them in w's current slice.
func (s *Store) plan(w *Window, lim Limits, costs []Cost, cur int64) Grant {
	usedR, usedT := w.sum(math.MinInt64)
	burstFrom := cur - s.p.burstSlices() + 1
	burstR, burstT := w.sum(burstFrom)
	minR, minT, capR, capT := lim.caps(s.p.BurstFraction)
	g := Grant{Slice: cur, ValidUntil: s.sliceStart(cur + 1).Add(s.p.DispatchGrace)}
	var addR, addT int64
	for _, c := range costs {
		r, t := int64(c.Requests), int64(c.Tokens)
		switch {
		case lim.RPM > 0 && usedR+addR+r > minR:
			g.Reason = "rpm"
		case lim.TPM > 0 && usedT+addT+t > minT:
			g.Reason = "tpm"
		case lim.RPM > 0 && burstR+addR > 0 && burstR+addR+r > capR:
			g.Reason = "burst"
		case lim.TPM > 0 && burstT+addT > 0 && burstT+addT+t > capT:
			g.Reason = "burst"
		}
		if g.Reason != "" {
			g.RetryAt = s.retryAt(w, lim, c, cur, addR, addT, g.Reason)
			break
		}
		addR += r
		addT += t
		g.N++
	}
	if g.N > 0 {
		v := w.Slices[cur]
		v[0] += addR
		v[1] += addT
		w.Slices[cur] = v
	}
	return g
}

// retryAt finds when cost c could fit: for the minute limits, the end of the
// window of the oldest slices that must expire; for the burst cap, the next
// slice.
func (s *Store) retryAt(w *Window, lim Limits, c Cost, cur, addR, addT int64, reason string) time.Time {
	next := s.sliceStart(cur + 1)
	if reason == "burst" {
		return next
	}
	usedR, usedT := w.sum(math.MinInt64)
	usedR += addR
	usedT += addT
	minR, minT, _, _ := lim.caps(s.p.BurstFraction)
	needR := usedR + int64(c.Requests) - minR
	needT := usedT + int64(c.Tokens) - minT
	if lim.RPM == 0 {
		needR = 0
	}
	if lim.TPM == 0 {
		needT = 0
	}
	keys := w.keys()
	var freedR, freedT int64
	for _, k := range keys {
		if freedR >= needR && freedT >= needT {
			break
		}
		v := w.Slices[k]
		freedR += v[0]
		freedT += v[1]
		// slice k leaves the window when the current slice is k+Span.
		next = s.sliceStart(k + s.p.Span())
	}
	if freedR < needR || freedT < needT {
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
}

func (w *Window) sum(from int64) (r, t int64) {
	for k, v := range w.Slices {
		if k >= from {
			r += v[0]
			t += v[1]
		}
	}
	return r, t
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

// maxAttempts bounds the compare-and-sets one Take or Settle tries.
const maxAttempts = 51

func (s *Store) load(ctx context.Context, key string) (Window, uint64, error) {
	w := Window{Slices: map[int64][2]int64{}}
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return w, 0, nil
	}
	if err != nil {
		return w, 0, fmt.Errorf("%w: get %s: %v", ErrUnavailable, key, err)
	}
	if len(e.Value()) > 0 {
		var raw struct {
			S    map[string][2]int64 `json:"s"`
			P    []planned           `json:"p"`
			TAT  [2]int64            `json:"tat"`
			Last int64               `json:"last"`
		}
		if err := json.Unmarshal(e.Value(), &raw); err != nil {
			return w, 0, fmt.Errorf("budget %s: corrupt window: %w", key, err)
		}
		w.P, w.TAT, w.Last = raw.P, raw.TAT, raw.Last
		for k, v := range raw.S {
			n, err := strconv.ParseInt(k, 10, 64)
			if err != nil {
				return w, 0, fmt.Errorf("budget %s: corrupt slice %q", key, k)
			}
			w.Slices[n] = v
		}
	}
	return w, e.Revision(), nil
}

func (s *Store) store(ctx context.Context, key string, w Window, rev uint64) error {
	data, err := json.Marshal(w)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = s.kv.Create(ctx, key, data)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return errConflict
		}
	} else {
		_, err = s.kv.Update(ctx, key, data, rev)
		if IsConflict(err) {
			return errConflict
		}
	}
	if err != nil {
		return fmt.Errorf("%w: write %s: %v", ErrUnavailable, key, err)
	}
	if s.Writes != nil {
		s.Writes()
	}
	return nil
}

// IsConflict reports a lost compare-and-set on a KV key.
func IsConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// ModelKey is the budgets key of a provider/model.
func ModelKey(provider, modelToken string) string { return "rate." + provider + "." + modelToken }

// Charge adds cost to key's current slice (the provider reported less room
// than the shared view believed). It only ever lowers what is available.
func (s *Store) Charge(ctx context.Context, key string, extra Cost) error {
	return s.Settle(ctx, key, s.sliceOf(s.now()), extra)
}

// CalibrationKey is the budgets key holding a model's estimate calibration.
func CalibrationKey(provider, modelToken string) string {
	return "calib." + provider + "." + modelToken
}

// Return gives back cost reserved in slice and not spent (a lease's
// leftover). Usage never goes below zero; a slice already out of every
// window is left alone.
func (s *Store) Return(ctx context.Context, key string, slice int64, c Cost) error {
	if c.Requests <= 0 && c.Tokens <= 0 {
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
		v[0] = max(v[0]-int64(max(c.Requests, 0)), 0)
		v[1] = max(v[1]-int64(max(c.Tokens, 0)), 0)
		w.Slices[slice] = v
		return true
	})
}

// SliceOf returns the slice index of t.
func (s *Store) SliceOf(t time.Time) int64 { return s.sliceOf(t) }

// ValidUntil returns the latest start of a call reserved in slice k.
func (s *Store) ValidUntil(k int64) time.Time { return s.sliceStart(k + 1).Add(s.p.DispatchGrace) }
