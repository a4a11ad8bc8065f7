package budget_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
)

func TestIsConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conflicts := func(replicated bool) (create, update error) {
		kv := newFakeKV()
		kv.replicated = replicated
		if _, err := kv.Create(ctx, key, []byte("{}")); err != nil {
			t.Fatalf("Create: %v", err)
		}
		_, create = kv.Create(ctx, key, []byte("{}"))
		_, update = kv.Update(ctx, key, []byte("{}"), 99)
		return create, update
	}
	create1, update1 := conflicts(false)
	createR, updateR := conflicts(true)
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"fake Create of an existing key", create1, true},
		{"fake Update with a stale revision", update1, true},
		{"fake Create of an existing key, replicated", createR, true},
		{"fake Update with a stale revision, replicated", updateR, true},
		{"ErrKeyExists", jetstream.ErrKeyExists, true},
		{"ErrKeyRevisionMismatch", jetstream.ErrKeyRevisionMismatch, true},
		{"wrapped ErrKeyRevisionMismatch", fmt.Errorf("update: %w", jetstream.ErrKeyRevisionMismatch), true},
		{"nil", nil, false},
		{"ErrKeyNotFound", jetstream.ErrKeyNotFound, false},
		{"other API error", &jetstream.APIError{Code: 503, ErrorCode: jetstream.JSErrCodeJetStreamNotEnabled}, false},
		{"timeout", context.DeadlineExceeded, false},
	} {
		if got := budget.IsConflict(tc.err); got != tc.want {
			t.Errorf("IsConflict(%s: %v): got %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
	// The fake's errors have jetstream's shapes.
	for _, err := range []error{create1, createR} {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			t.Errorf("fake Create conflict %v: got no ErrKeyExists, want it", err)
		}
	}
	for _, err := range []error{update1, updateR} {
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			t.Errorf("fake Update conflict %v: got no ErrKeyRevisionMismatch, want it", err)
		}
	}
}

func TestParamsSpan(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p    budget.Params
		want int64
	}{
		{defaultParams, 245}, // ceil(61s/250ms) + 1
		{budget.Params{Slice: time.Second}, 61},
		{budget.Params{Slice: time.Second, DispatchGrace: time.Second}, 62},
		{budget.Params{Slice: 300 * time.Millisecond, DispatchGrace: time.Second}, 205}, // ceil(203.3) + 1
		{budget.Params{Slice: 10 * time.Millisecond, DispatchGrace: 30 * time.Second}, 9001},
		{budget.Params{Slice: 5 * time.Second, DispatchGrace: 0}, 13},
	} {
		if got := tc.p.Span(); got != tc.want {
			t.Errorf("Span(%v slices, %v grace): got %d, want %d", tc.p.Slice, tc.p.DispatchGrace, got, tc.want)
		}
		// Two reservations further apart than Span slices can never start
		// inside one 60 s window: the later one's earliest start minus the
		// earlier one's latest start is at least 60 s.
		gap := time.Duration(tc.p.Span()-1)*tc.p.Slice - tc.p.DispatchGrace
		if gap < time.Minute {
			t.Errorf("Span(%v, %v) = %d: reservations %d slices apart may start %v apart, want at least 60s",
				tc.p.Slice, tc.p.DispatchGrace, tc.p.Span(), tc.p.Span(), gap)
		}
	}
}

func TestModelKey(t *testing.T) {
	t.Parallel()
	if got, want := budget.ModelKey("openai", "gpt-4_1-mini"), "rate.openai.gpt-4_1-mini"; got != want {
		t.Errorf("ModelKey: got %q, want %q", got, want)
	}
}

func TestNewStore(t *testing.T) {
	t.Parallel()
	s := budget.NewStore(newFakeKV(), defaultParams, nil) // nil: the real clock
	if got, want := s.Params(), defaultParams; got != want {
		t.Errorf("Params: got %+v, want %+v", got, want)
	}
	before := time.Now()
	g, err := s.Take(context.Background(), key, budget.Limits{RPM: 10}, costs(1, budget.Cost{Requests: 1}))
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	if k := sliceOf(defaultParams, before); g.Slice < k || g.Slice > k+4 {
		t.Errorf("slice with the real clock: got %d, want about %d", g.Slice, k)
	}
}

func TestTakeRPM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, noBurst)
	lim := budget.Limits{RPM: 10}
	one := budget.Cost{Requests: 1, Tokens: 10}
	cur := b.at(0, 100*time.Millisecond)
	span := b.p.Span()
	validUntil := sliceStart(b.p, cur+1).Add(b.p.DispatchGrace)
	// The grants all sit in slice cur, which leaves the window when the
	// current slice is cur+Span.
	retryAt := sliceStart(b.p, cur+span)

	g, err := b.store.Take(ctx, key, lim, costs(15, one))
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	checkGrant(t, "first take", g, budget.Grant{N: 10, Slice: cur, ValidUntil: validUntil, RetryAt: retryAt, Reason: "rpm"})

	b.clock.Advance(100 * time.Millisecond) // same slice
	g, err = b.store.Take(ctx, key, lim, costs(1, one))
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	checkGrant(t, "second take in the same slice", g, budget.Grant{N: 0, Slice: cur, ValidUntil: validUntil, RetryAt: retryAt, Reason: "rpm"})

	b.clock.Set(retryAt.Add(-time.Nanosecond))
	g, err = b.store.Take(ctx, key, lim, costs(1, one))
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	if g.N != 0 || g.Reason != "rpm" {
		t.Errorf("take just before RetryAt: got N=%d reason=%q, want N=0 reason=rpm", g.N, g.Reason)
	}

	b.clock.Set(retryAt)
	g, err = b.store.Take(ctx, key, lim, costs(10, one))
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	if g.N != 10 || g.Reason != "" || !g.RetryAt.IsZero() {
		t.Errorf("take at RetryAt: got N=%d reason=%q retry_at=%v, want N=10, no reason, zero retry_at", g.N, g.Reason, g.RetryAt)
	}
}

// RetryAt is the start of the slice in which enough of the oldest slices
// have left the window for the first refused cost to fit.
func TestTakeRetryAt(t *testing.T) {
	t.Parallel()
	r := func(n int) budget.Cost { return budget.Cost{Requests: n, Tokens: n} }
	tok := func(n int) budget.Cost { return budget.Cost{Requests: 1, Tokens: n} }
	for _, tc := range []struct {
		name string
		lim  budget.Limits
		// fill reserves these costs at these slice offsets first.
		fill map[int64]budget.Cost
		// then at offset now, ask for ask.
		now int64
		ask []budget.Cost
		// want: how many granted, why the rest was refused, and the offset of
		// the slice whose leaving frees enough (RetryAt = its start + Span).
		wantN      int
		wantReason string
		wantFreed  int64
	}{
		{name: "oldest slice frees enough", lim: budget.Limits{RPM: 10}, fill: map[int64]budget.Cost{0: r(4), 8: r(6)}, now: 20, ask: []budget.Cost{r(1)}, wantReason: "rpm", wantFreed: 0},
		{name: "oldest slice frees exactly enough", lim: budget.Limits{RPM: 10}, fill: map[int64]budget.Cost{0: r(4), 8: r(6)}, now: 20, ask: []budget.Cost{r(4)}, wantReason: "rpm", wantFreed: 0},
		{name: "two slices must leave", lim: budget.Limits{RPM: 10}, fill: map[int64]budget.Cost{0: r(4), 8: r(6)}, now: 20, ask: []budget.Cost{r(5)}, wantReason: "rpm", wantFreed: 8},
		{name: "same slice", lim: budget.Limits{RPM: 10}, fill: map[int64]budget.Cost{3: r(10)}, now: 3, ask: []budget.Cost{r(1)}, wantReason: "rpm", wantFreed: 3},
		{name: "prefix granted now must leave too", lim: budget.Limits{RPM: 10}, fill: map[int64]budget.Cost{0: r(2)}, now: 5, ask: []budget.Cost{r(6), r(5)}, wantN: 1, wantReason: "rpm", wantFreed: 5},
		{name: "tokens bind", lim: budget.Limits{RPM: 100, TPM: 1000}, fill: map[int64]budget.Cost{0: tok(300), 5: tok(300), 9: tok(400)}, now: 30, ask: []budget.Cost{tok(500)}, wantReason: "tpm", wantFreed: 5},
		{name: "tokens bind after a prefix", lim: budget.Limits{TPM: 1000}, fill: map[int64]budget.Cost{1: tok(600)}, now: 2, ask: []budget.Cost{tok(300), tok(200)}, wantN: 1, wantReason: "tpm", wantFreed: 1},
		{name: "both bind, rpm reported", lim: budget.Limits{RPM: 2, TPM: 1000}, fill: map[int64]budget.Cost{0: tok(500), 1: tok(500)}, now: 2, ask: []budget.Cost{tok(600)}, wantReason: "rpm", wantFreed: 1},
		{name: "request above the limit waits a full window", lim: budget.Limits{TPM: 1000}, fill: map[int64]budget.Cost{0: tok(10)}, now: 7, ask: []budget.Cost{tok(1001)}, wantReason: "tpm", wantFreed: 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, noBurst)
			for off := int64(0); off <= tc.now; off++ {
				c, ok := tc.fill[off]
				if !ok {
					continue
				}
				b.at(off, 0)
				g, err := b.store.Take(ctx, key, tc.lim, []budget.Cost{c})
				if err != nil || g.N != 1 {
					t.Fatalf("fill at %d: got N=%d err=%v, want N=1", off, g.N, err)
				}
			}
			cur := b.at(tc.now, 50*time.Millisecond)
			g, err := b.store.Take(ctx, key, tc.lim, tc.ask)
			if err != nil {
				t.Fatalf("Take: %v", err)
			}
			k0 := sliceOf(b.p, t0)
			checkGrant(t, "take", g, budget.Grant{
				N: tc.wantN, Slice: cur, Reason: tc.wantReason,
				ValidUntil: sliceStart(b.p, cur+1).Add(b.p.DispatchGrace),
				RetryAt:    sliceStart(b.p, k0+tc.wantFreed+b.p.Span()),
			})
		})
	}
}

func TestTakeTPM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, noBurst)
	lim := budget.Limits{RPM: 1000, TPM: 10_000}
	big := budget.Cost{Requests: 1, Tokens: 4000}
	cur := b.at(0, 0)
	g, err := b.store.Take(ctx, key, lim, costs(3, big))
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	checkGrant(t, "take", g, budget.Grant{N: 2, Slice: cur, Reason: "tpm",
		ValidUntil: sliceStart(b.p, cur+1).Add(b.p.DispatchGrace), RetryAt: sliceStart(b.p, cur+b.p.Span())})
	// A smaller cost still fits the minute.
	g, err = b.store.Take(ctx, key, lim, []budget.Cost{{Requests: 1, Tokens: 2000}, {Requests: 1, Tokens: 1}})
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	if g.N != 1 || g.Reason != "tpm" {
		t.Errorf("take of 2000 + 1 tokens with 2000 left: got N=%d reason=%q, want N=1 reason=tpm", g.N, g.Reason)
	}
	used, err := b.store.Used(ctx, key)
	if err != nil {
		t.Fatalf("Used: %v", err)
	}
	if want := (budget.Cost{Requests: 3, Tokens: 10_000}); used != want {
		t.Errorf("Used: got %+v, want %+v", used, want)
	}
}

func TestTakeBurst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lim := budget.Limits{TPM: 100_000} // burst cap: 5 % = 5,000 tokens per trailing second
	c3k := budget.Cost{Requests: 1, Tokens: 3000}
	one := budget.Cost{Requests: 1, Tokens: 1}
	take := func(t *testing.T, b *bundle, lim budget.Limits, cs []budget.Cost) budget.Grant {
		t.Helper()
		g, err := b.store.Take(ctx, key, lim, cs)
		if err != nil {
			t.Fatalf("Take: %v", err)
		}
		return g
	}
	burst := func(b *bundle, cur int64, n int) budget.Grant {
		return budget.Grant{N: n, Slice: cur, Reason: "burst",
			ValidUntil: sliceStart(b.p, cur+1).Add(b.p.DispatchGrace), RetryAt: sliceStart(b.p, cur+1)}
	}

	t.Run("second grant in the same second", func(t *testing.T) {
		t.Parallel()
		b := setup(t, defaultParams)
		cur := b.at(0, 10*time.Millisecond)
		if g := take(t, b, lim, []budget.Cost{c3k}); g.N != 1 || g.Reason != "" {
			t.Fatalf("first take: got N=%d reason=%q, want N=1", g.N, g.Reason)
		}
		b.clock.Advance(100 * time.Millisecond)
		checkGrant(t, "same slice", take(t, b, lim, []budget.Cost{c3k}), burst(b, cur, 0))
		// The cap covers the trailing second (4 slices), not one slice.
		for off := int64(1); off <= 3; off++ {
			cur := b.at(off, 0)
			checkGrant(t, fmt.Sprintf("slice +%d", off), take(t, b, lim, []budget.Cost{c3k}), burst(b, cur, 0))
		}
		b.at(4, 0)
		if g := take(t, b, lim, []budget.Cost{c3k}); g.N != 1 {
			t.Errorf("a second later: got N=%d reason=%q, want N=1", g.N, g.Reason)
		}
	})

	t.Run("fits under the cap", func(t *testing.T) {
		t.Parallel()
		b := setup(t, defaultParams)
		cur := b.at(0, 0)
		g := take(t, b, lim, []budget.Cost{c3k, {Requests: 1, Tokens: 2000}, one})
		checkGrant(t, "take", g, burst(b, cur, 2))
	})

	t.Run("one cost above the cap alone in its second", func(t *testing.T) {
		t.Parallel()
		b := setup(t, defaultParams)
		cur := b.at(0, 0)
		g := take(t, b, lim, []budget.Cost{{Requests: 1, Tokens: 8000}, one})
		checkGrant(t, "take", g, burst(b, cur, 1))
		b.at(4, 0)
		if g := take(t, b, lim, []budget.Cost{{Requests: 1, Tokens: 8000}}); g.N != 1 {
			t.Errorf("a second later: got N=%d reason=%q, want N=1", g.N, g.Reason)
		}
	})

	t.Run("requests", func(t *testing.T) {
		t.Parallel()
		b := setup(t, defaultParams)
		cur := b.at(0, 0)
		// RPM 100: the cap is 5 requests per trailing second.
		g := take(t, b, budget.Limits{RPM: 100}, costs(8, one))
		checkGrant(t, "take", g, burst(b, cur, 5))
	})

	t.Run("minute limit wins over burst", func(t *testing.T) {
		t.Parallel()
		b := setup(t, defaultParams)
		cur := b.at(0, 0)
		g := take(t, b, budget.Limits{TPM: 4000}, costs(2, c3k))
		checkGrant(t, "take", g, budget.Grant{N: 1, Slice: cur, Reason: "tpm",
			ValidUntil: sliceStart(b.p, cur+1).Add(b.p.DispatchGrace), RetryAt: sliceStart(b.p, cur+b.p.Span())})
	})
}

// TestTakeKeep: a reservation with Keep leaves that share of both windows
// (and at least KeepAtLeast of the burst second) to reservations without it.
func TestTakeKeep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	take := func(t *testing.T, b *bundle, lim budget.Limits, cs []budget.Cost) budget.Grant {
		t.Helper()
		g, err := b.store.Take(ctx, key, lim, cs)
		if err != nil {
			t.Fatalf("Take: %v", err)
		}
		return g
	}
	t.Run("minute", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noBurst)
		b.at(0, 0)
		kept := budget.Limits{TPM: 10_000, Keep: 0.1}
		// 9,000 of 10,000 tokens for the backlog, in 1,000-token jobs.
		if g := take(t, b, kept, costs(10, budget.Cost{Requests: 1, Tokens: 1000})); g.N != 9 || g.Reason != "tpm" {
			t.Fatalf("kept take: got N=%d reason=%q, want N=9 reason=tpm", g.N, g.Reason)
		}
		// The rest is there for a job reserving against the full limit.
		if g := take(t, b, budget.Limits{TPM: 10_000}, costs(2, budget.Cost{Requests: 1, Tokens: 1000})); g.N != 1 || g.Reason != "tpm" {
			t.Errorf("full take: got N=%d reason=%q, want N=1 reason=tpm", g.N, g.Reason)
		}
	})
	t.Run("burst second keeps at least one job", func(t *testing.T) {
		t.Parallel()
		b := setup(t, defaultParams)
		b.at(0, 0)
		// TPM 100,000: the burst cap is 5,000 tokens; 5 % of it is 250, less
		// than one 400-token job, so KeepAtLeast decides: 4,600 for the backlog.
		kept := budget.Limits{TPM: 100_000, Keep: 0.05, KeepAtLeast: budget.Cost{Requests: 1, Tokens: 400}}
		job := budget.Cost{Requests: 1, Tokens: 400}
		if g := take(t, b, kept, costs(20, job)); g.N != 11 || g.Reason != "burst" {
			t.Fatalf("kept take: got N=%d reason=%q, want N=11 (4,400 tokens) reason=burst", g.N, g.Reason)
		}
		if g := take(t, b, budget.Limits{TPM: 100_000}, costs(2, job)); g.N != 1 {
			t.Errorf("full take: got N=%d reason=%q, want N=1", g.N, g.Reason)
		}
	})
	t.Run("a job that is most of the second keeps only a tenth of it", func(t *testing.T) {
		t.Parallel()
		b := setup(t, defaultParams)
		b.at(0, 0)
		// KeepAtLeast 4,000 of a 5,000 cap: only 500 (a tenth) is kept.
		kept := budget.Limits{TPM: 100_000, Keep: 0.05, KeepAtLeast: budget.Cost{Requests: 1, Tokens: 4000}}
		if g := take(t, b, kept, costs(50, budget.Cost{Requests: 1, Tokens: 100})); g.N != 45 || g.Reason != "burst" {
			t.Errorf("kept take: got N=%d reason=%q, want N=45 (4,500 tokens) reason=burst", g.N, g.Reason)
		}
	})
}

func TestTakeUnlimitedAndEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, defaultParams)
	g, err := b.store.Take(ctx, key, budget.Limits{}, nil)
	if err != nil || g.N != 0 || g.Reason != "" {
		t.Errorf("Take of nothing: got N=%d reason=%q err=%v, want N=0, no reason, nil", g.N, g.Reason, err)
	}
	if w, _ := b.kv.stats(); w != 0 {
		t.Errorf("Take of nothing: got %d writes, want 0", w)
	}
	g, err = b.store.Take(ctx, key, budget.Limits{}, costs(1000, budget.Cost{Requests: 1, Tokens: 1_000_000}))
	if err != nil || g.N != 1000 || g.Reason != "" || !g.RetryAt.IsZero() {
		t.Errorf("Take without limits: got N=%d reason=%q retry_at=%v err=%v, want all 1000", g.N, g.Reason, g.RetryAt, err)
	}
}

func TestTakeWritesOncePerGrant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, noBurst)
	var writes, conflicts int
	b.store.Writes = func() { writes++ }
	b.store.Conflicts = func() { conflicts++ }
	lim := budget.Limits{RPM: 5}
	for i, want := range []int{5, 0, 0} {
		g, err := b.store.Take(ctx, key, lim, costs(6, budget.Cost{Requests: 1}))
		if err != nil || g.N != want {
			t.Fatalf("take %d: got N=%d err=%v, want N=%d", i, g.N, err, want)
		}
	}
	if writes != 1 || conflicts != 0 {
		t.Errorf("writes, conflicts: got %d, %d, want 1, 0 (a refused take writes nothing)", writes, conflicts)
	}
}

// The stored value is the wire format every process shares.
func TestWindowFormat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, noBurst)
	cur := b.at(0, 0)
	if _, err := b.store.Take(ctx, key, budget.Limits{}, []budget.Cost{{Requests: 2, Tokens: 300}}); err != nil {
		t.Fatal(err)
	}
	var raw map[string]map[string][2]int64
	if err := json.Unmarshal(b.kv.value(key), &raw); err != nil {
		t.Fatalf("stored value %s: %v", b.kv.value(key), err)
	}
	if got, want := raw["s"][fmt.Sprint(cur)], [2]int64{2, 300}; got != want {
		t.Errorf("stored slice %d: got %v, want %v (in %s)", cur, got, want, b.kv.value(key))
	}
}

func TestSettle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	window := func(t *testing.T, b *bundle) budget.Window {
		t.Helper()
		var w budget.Window
		if err := json.Unmarshal(b.kv.value(key), &w); err != nil {
			t.Fatalf("stored window: %v", err)
		}
		return w
	}
	setupTaken := func(t *testing.T) (*bundle, int64) {
		t.Helper()
		b := setup(t, noBurst)
		k := b.at(0, 0)
		if g, err := b.store.Take(ctx, key, budget.Limits{TPM: 10_000}, []budget.Cost{{Requests: 1, Tokens: 1000}}); err != nil || g.N != 1 {
			t.Fatalf("Take: got N=%d err=%v", g.N, err)
		}
		return b, k
	}

	t.Run("adds to the reservation's slice", func(t *testing.T) {
		t.Parallel()
		b, k := setupTaken(t)
		b.at(5, 0)
		if err := b.store.Settle(ctx, key, k, budget.Cost{Tokens: 250}); err != nil {
			t.Fatalf("Settle: %v", err)
		}
		w := window(t, b)
		if got, want := w.Slices[k], (budget.Vec{1, 1250}); got != want {
			t.Errorf("slice %d: got %v, want %v", k, got, want)
		}
		if got, want := len(w.Slices), 1; got != want {
			t.Errorf("slices: got %d (%v), want %d", got, w.Slices, want)
		}
		used, err := b.store.Used(ctx, key)
		if err != nil || used != (budget.Cost{Requests: 1, Tokens: 1250}) {
			t.Errorf("Used: got %+v, %v, want 1 request 1250 tokens", used, err)
		}
		// It counts against the limit.
		g, err := b.store.Take(ctx, key, budget.Limits{TPM: 10_000}, []budget.Cost{{Requests: 1, Tokens: 8800}})
		if err != nil || g.N != 0 || g.Reason != "tpm" {
			t.Errorf("Take beyond the settled window: got N=%d reason=%q err=%v, want refused for tpm", g.N, g.Reason, err)
		}
	})

	t.Run("requests too, never negative", func(t *testing.T) {
		t.Parallel()
		b, k := setupTaken(t)
		if err := b.store.Settle(ctx, key, k, budget.Cost{Requests: 1, Tokens: -500}); err != nil {
			t.Fatalf("Settle: %v", err)
		}
		if got, want := window(t, b).Slices[k], (budget.Vec{2, 1000}); got != want {
			t.Errorf("slice %d: got %v, want %v", k, got, want)
		}
	})

	t.Run("nothing to add", func(t *testing.T) {
		t.Parallel()
		b, k := setupTaken(t)
		rev := b.kv.revision(key)
		for _, c := range []budget.Cost{{}, {Tokens: -5}, {Requests: -1, Tokens: 0}} {
			if err := b.store.Settle(ctx, key, k, c); err != nil {
				t.Errorf("Settle(%+v): %v", c, err)
			}
		}
		if got := b.kv.revision(key); got != rev {
			t.Errorf("revision after empty settles: got %d, want %d unchanged", got, rev)
		}
	})

	t.Run("last slice of the window", func(t *testing.T) {
		t.Parallel()
		b, k := setupTaken(t)
		b.at(b.p.Span()-1, 0) // slice k is the oldest still in the window
		if err := b.store.Settle(ctx, key, k, budget.Cost{Tokens: 1}); err != nil {
			t.Fatalf("Settle: %v", err)
		}
		if got, want := window(t, b).Slices[k], (budget.Vec{1, 1001}); got != want {
			t.Errorf("slice %d: got %v, want %v", k, got, want)
		}
	})

	t.Run("slice already outside the window", func(t *testing.T) {
		t.Parallel()
		b, k := setupTaken(t)
		b.at(b.p.Span(), 0)
		rev := b.kv.revision(key)
		if err := b.store.Settle(ctx, key, k, budget.Cost{Tokens: 5000}); err != nil {
			t.Fatalf("Settle: %v", err)
		}
		if got := b.kv.revision(key); got != rev {
			t.Errorf("revision: got %d, want %d (no write)", got, rev)
		}
		used, err := b.store.Used(ctx, key)
		if err != nil || used != (budget.Cost{}) {
			t.Errorf("Used: got %+v, %v, want nothing", used, err)
		}
	})

	t.Run("on a fresh key", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noBurst)
		k := b.at(0, 0)
		if err := b.store.Settle(ctx, key, k, budget.Cost{Tokens: 7}); err != nil {
			t.Fatalf("Settle: %v", err)
		}
		if got, want := window(t, b).Slices[k], (budget.Vec{0, 7}); got != want {
			t.Errorf("slice %d: got %v, want %v", k, got, want)
		}
	})
}

func TestUsed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, noBurst)
	if used, err := b.store.Used(ctx, key); err != nil || used != (budget.Cost{}) {
		t.Errorf("Used of a fresh key: got %+v, %v, want zero, nil", used, err)
	}
	for _, off := range []int64{0, 10, 20} {
		b.at(off, 0)
		if _, err := b.store.Take(ctx, key, budget.Limits{}, []budget.Cost{{Requests: 1, Tokens: 100}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		off  int64
		want budget.Cost
	}{
		{20, budget.Cost{Requests: 3, Tokens: 300}},
		{b.p.Span() - 1, budget.Cost{Requests: 3, Tokens: 300}},
		{b.p.Span(), budget.Cost{Requests: 2, Tokens: 200}},
		{b.p.Span() + 20, budget.Cost{}},
	} {
		b.at(tc.off, 0)
		if used, err := b.store.Used(ctx, key); err != nil || used != tc.want {
			t.Errorf("Used at slice +%d: got %+v, %v, want %+v", tc.off, used, err, tc.want)
		}
	}
}

// A store that cannot read or write the bucket grants nothing (fail closed).
func TestFailClosed(t *testing.T) {
	t.Parallel()
	down := errors.New("nats: timeout")
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		prepare func(*fakeKV)
		want    error // nil: any error
		wantMsg string
	}{
		{name: "get fails", ctx: context.Background(), prepare: func(kv *fakeKV) { kv.getErr = down }, want: budget.ErrUnavailable, wantMsg: "nats: timeout"},
		{name: "write fails", ctx: context.Background(), prepare: func(kv *fakeKV) { kv.writeErr = down }, want: budget.ErrUnavailable, wantMsg: "nats: timeout"},
		{name: "context canceled", ctx: canceled, prepare: func(*fakeKV) {}, want: budget.ErrUnavailable},
		{name: "corrupt window", ctx: context.Background(), prepare: func(kv *fakeKV) {
			kv.set(key, []byte(`{"s":[1,2]}`))
		}, wantMsg: "corrupt window"},
		{name: "corrupt slice", ctx: context.Background(), prepare: func(kv *fakeKV) {
			kv.set(key, []byte(`{"s":{"x":[1,2]}}`))
		}, wantMsg: `corrupt slice "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, defaultParams)
			k := b.at(0, 0)
			tc.prepare(b.kv)
			check := func(op string, err error) {
				t.Helper()
				if err == nil {
					t.Errorf("%s: got nil error, want one", op)
					return
				}
				if tc.want != nil && !errors.Is(err, tc.want) {
					t.Errorf("%s: got %v, want an error wrapping %v", op, err, tc.want)
				}
				if !strings.Contains(err.Error(), tc.wantMsg) {
					t.Errorf("%s: got %q, want it to contain %q", op, err, tc.wantMsg)
				}
			}
			g, err := b.store.Take(tc.ctx, key, budget.Limits{RPM: 10}, costs(3, budget.Cost{Requests: 1}))
			check("Take", err)
			if g.N != 0 {
				t.Errorf("Take: got N=%d with the error, want 0", g.N)
			}
			check("Settle", b.store.Settle(tc.ctx, key, k, budget.Cost{Tokens: 1}))
			if tc.name != "write fails" { // Used only reads
				_, err = b.store.Used(tc.ctx, key)
				check("Used", err)
			}
		})
	}
}

// A lost compare-and-set is retried on fresh state: no update is lost.
func TestTakeRetriesConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, noBurst)
	other := budget.NewStore(b.kv, b.p, b.clock.Now)
	lim := budget.Limits{RPM: 10}
	b.at(0, 0)
	if _, err := other.Take(ctx, key, lim, costs(2, budget.Cost{Requests: 1})); err != nil {
		t.Fatal(err)
	}
	var writes, conflicts int
	b.store.Writes = func() { writes++ }
	b.store.Conflicts = func() { conflicts++ }
	// Between this store's read and its write, another process takes 5.
	interfered := false
	b.kv.beforeUpdate = func(string) {
		if interfered {
			return
		}
		interfered = true
		if g, err := other.Take(ctx, key, lim, costs(5, budget.Cost{Requests: 1})); err != nil || g.N != 5 {
			t.Errorf("other Take: got N=%d err=%v, want N=5", g.N, err)
		}
	}
	g, err := b.store.Take(ctx, key, lim, costs(6, budget.Cost{Requests: 1}))
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	if g.N != 3 || g.Reason != "rpm" {
		t.Errorf("Take after a lost compare-and-set: got N=%d reason=%q, want N=3 reason=rpm (2+5 already taken)", g.N, g.Reason)
	}
	if writes != 1 || conflicts != 1 {
		t.Errorf("writes, conflicts: got %d, %d, want 1, 1", writes, conflicts)
	}
	if used, _ := b.store.Used(ctx, key); used.Requests != 10 {
		t.Errorf("Used: got %d requests, want 10", used.Requests)
	}
}

func BenchmarkTake(b *testing.B) {
	ctx := context.Background()
	bb := setup(b, defaultParams)
	batch := costs(100, budget.Cost{Requests: 1, Tokens: 500})
	lim := budget.Limits{RPM: 1 << 40, TPM: 1 << 50}
	// Fill a whole window so each Take reads and writes Span slices.
	for range bb.p.Span() {
		if _, err := bb.store.Take(ctx, key, lim, batch); err != nil {
			b.Fatal(err)
		}
		bb.clock.Advance(bb.p.Slice)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		g, err := bb.store.Take(ctx, key, lim, batch)
		if err != nil || g.N != len(batch) {
			b.Fatalf("Take: got N=%d err=%v", g.N, err)
		}
		bb.clock.Advance(bb.p.Slice)
	}
}
