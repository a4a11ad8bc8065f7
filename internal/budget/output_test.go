package budget_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
)

// TestPacedOutputDimension: output tokens limited apart (Anthropic's OTPM)
// pace and bound placements like any dimension, and survive the stored
// form; the input limit (TPM) is not charged the output.
func TestPacedOutputDimension(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	// 600 output tokens a minute: 300 each paces every 30 s.
	lim := budget.Limits{RPM: 100_000, TPM: 1_000, OTPM: 600, BurstOutput: 600}
	one := budget.Cost{Requests: 1, Tokens: 10, Output: 300}
	g, err := b.store.Take(ctx, key, lim, costs(3, one))
	if err != nil {
		t.Fatal(err)
	}
	if g.N != 1 || g.Reason == "" {
		t.Fatalf("granted %d of 3 (reason %q); 300 output tokens at 600 a minute leave the next 30 s ahead, past the horizon", g.N, g.Reason)
	}
	used, err := b.store.Used(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if used.Output != 300 || used.Tokens != 10 {
		t.Errorf("window holds %+v, want 300 output and 10 input tokens", used)
	}
	// Stored and read back, the output is where it was.
	w := budget.Window{Slices: map[int64]budget.Vec{}}
	v := budget.Vec{}
	v[len(v)-1] = 300
	w.Slices[7] = v
	data, _ := w.MarshalJSON()
	var back budget.Window
	if err := json.Unmarshal(data, &back); err != nil || back.Slices[7] != v {
		t.Errorf("round trip %s: %v %v", data, back.Slices[7], err)
	}
	// An output larger than the minute can never be placed.
	if g, err := b.store.Take(ctx, "other", lim, []budget.Cost{{Requests: 1, Output: 700}}); err != nil || g.N != 0 || g.Reason != "otpm" {
		t.Errorf("700 output tokens at 600 a minute: granted %d, reason %q, err %v; want none, otpm", g.N, g.Reason, err)
	}
}

// TestReturnRewind: output given back by a provider that charges what it
// counted (a bucket) rewinds the pace, so the next placement need not wait
// for output that was never produced; the minute still bounds it.
func TestReturnRewind(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	lim := budget.Limits{RPM: 100_000, TPM: 1_000, OTPM: 600, BurstOutput: 600}
	one := budget.Cost{Requests: 1, Tokens: 10, Output: 300}
	g, err := b.store.Take(ctx, key, lim, []budget.Cost{one})
	if err != nil || g.N != 1 {
		t.Fatalf("first: %+v %v", g, err)
	}
	if g2, _ := b.store.Take(ctx, key, lim, []budget.Cost{one}); g2.N != 0 {
		t.Fatalf("second placed at once (%v); 300 of 600 a minute should pace it 30 s on", g2.SendAt)
	}
	// The answer used 5 of its 300: 295 come back, and the pace with them.
	if err := b.store.ReturnRewind(ctx, key, g.SendAt[0], budget.Cost{Output: 295}, lim); err != nil {
		t.Fatal(err)
	}
	g2, err := b.store.Take(ctx, key, lim, []budget.Cost{one})
	if err != nil || g2.N != 1 {
		t.Fatalf("after the rewind: granted %d (reason %q), want the next placed within the horizon", g2.N, g2.Reason)
	}
	if used, _ := b.store.Used(ctx, key); used.Output != 305 {
		t.Errorf("window holds %d output tokens, want 5 + 300", used.Output)
	}
}

// TestReturnRewindAll: several give-backs in one write rewind the pace by
// their sum, each taken from its own instant, as that many ReturnRewinds
// would; one whose instant left the window is skipped.
func TestReturnRewindAll(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	lim := budget.Limits{RPM: 100_000, TPM: 1_000, OTPM: 600, BurstOutput: 600}
	// 15 output tokens at 600 a minute pace every 1.5 s: two fit the
	// horizon, a third would wait past it.
	one := budget.Cost{Requests: 1, Tokens: 1, Output: 15}
	g, err := b.store.Take(ctx, key, lim, costs(3, one))
	if err != nil || g.N != 2 {
		t.Fatalf("three of 15 output at 600 a minute: %+v %v, want two placed", g, err)
	}
	if err := b.store.ReturnRewindAll(ctx, key, []budget.Return{{At: g.SendAt[0], Cost: budget.Cost{Output: 14}}, {At: g.SendAt[1], Cost: budget.Cost{Output: 13}},
		{At: g.SendAt[0].Add(-time.Hour), Cost: budget.Cost{Output: 50}}}, lim); err != nil {
		t.Fatal(err)
	}
	if used, _ := b.store.Used(ctx, key); used.Output != 3 {
		t.Errorf("window holds %d output tokens, want 1 + 2", used.Output)
	}
	// The pace came back by 27 of 30: the third now fits the horizon.
	if g3, err := b.store.Take(ctx, key, lim, []budget.Cost{one}); err != nil || g3.N != 1 {
		t.Errorf("after the returns: granted %d (reason %q, %v), want the next placed within the horizon", g3.N, g3.Reason, err)
	}
}

// TestLeaseRewindReturns: on a bucket provider (RewindReturns), a block
// the lease gives back unspent rewinds the pace, so the next placement
// need not wait behind room nobody used; without it, the pace stays where
// the block put it.
func TestLeaseRewindReturns(t *testing.T) {
	t.Parallel()
	// 600 output tokens a minute, placed at the pace (10 a second) at
	// most the store's horizon (2 s) ahead.
	lim := budget.Limits{RPM: 100_000, TPM: 100_000, OTPM: 600, BurstOutput: 600}
	job := budget.Cost{Requests: 1, Tokens: 1, Output: 10}
	block := budget.Cost{Requests: 1, Tokens: 1, Output: 15}
	for _, rewind := range []bool{false, true} {
		b := setup(t, pacedParams)
		ctx := context.Background()
		l := budget.NewLease(b.store, key)
		if rewind {
			l.RewindReturns(lim)
		}
		// One job placed now (the pace 1 s on), and a block for one more
		// behind it (1.5 s more).
		g, err := l.Take(ctx, lim, []budget.Cost{job}, []budget.Cost{block}, false, 0)
		if err != nil || g.N != 1 {
			t.Fatalf("rewind %v: first: %+v %v", rewind, g, err)
		}
		if used, _ := b.store.Used(ctx, key); used.Output != 25 {
			t.Fatalf("rewind %v: window holds %d output tokens, want the job's 10 and the block's 15", rewind, used.Output)
		}
		// The block goes back unspent: with the pace rewound, the next job
		// fits 1 s on; without, 2.5 s on, past the horizon.
		l.Expire(ctx, b.clock.Now(), true)
		g2, err := b.store.Take(ctx, key, lim, []budget.Cost{job})
		if err != nil {
			t.Fatal(err)
		}
		if placed := g2.N == 1; placed != rewind {
			t.Errorf("rewind %v: next placed %v (reason %q), want %v", rewind, placed, g2.Reason, rewind)
		}
	}
}

// TestOutputToleranceFillsABucket: a provider that charges max_tokens of
// output at arrival from a bucket of a minute's capacity and gives back
// what the answer did not use when the call ends (Anthropic's OTPM). Each
// call reserves 500, uses 190 and takes 600 ms; the executor rewinds the
// rest when it ends. Without a tolerance the schedule holds every call's
// whole 500 until it ends, so a backlog planned a short way ahead is paced
// at the calls' latency (0.89 of the limit here, less with a slower loop);
// with Limits.OutputTolerance the output the provider charges fills the
// limit, and its bucket never runs dry.
func TestOutputToleranceFillsABucket(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tol     time.Duration
		atLeast float64
		atMost  float64
	}{{0, 0, 0.93}, {10 * time.Second, 0.95, 1.2}} {
		fill, low := bucketRun(t, tc.tol)
		t.Logf("tolerance %s: OTPM fill %.3f, lowest bucket level %d", tc.tol, fill, low)
		if fill < tc.atLeast || fill > tc.atMost {
			t.Errorf("tolerance %s: OTPM fill %.3f as the provider charges it, want within [%.2f, %.2f]", tc.tol, fill, tc.atLeast, tc.atMost)
		}
		if low < 0 {
			t.Errorf("tolerance %s: the provider's bucket ran %d tokens dry (a 429)", tc.tol, -low)
		}
	}
}

// bucketRun runs a backlog against the bucket for 90 s of fake time and
// returns the output the provider kept in the last minute as a share of the
// limit, and the bucket's lowest level.
func bucketRun(t *testing.T, tol time.Duration) (fill float64, low int64) {
	t.Helper()
	const otpm, reserve, use = 30_000, 500, 190
	const latency, step = 600 * time.Millisecond, 20 * time.Millisecond
	// Executors are told their instants a quarter second ahead (a learned
	// send lead on a busy node).
	p := pacedParams
	p.Lead = 250 * time.Millisecond
	b := setup(t, p)
	ctx := context.Background()
	// Per-second caps at the whole minute, as adapt sets them for a
	// provider that limits output apart (a bucket, no quantum).
	lim := budget.Limits{RPM: 100_000, TPM: 1_000_000, OTPM: otpm, BurstRequests: 100_000, BurstTokens: 1_000_000, BurstOutput: otpm,
		Horizon: 750 * time.Millisecond, OutputTolerance: tol}
	type call struct {
		at   time.Time
		sent bool
	}
	var pending []call // placed and not ended
	level, last := int64(otpm), t0
	low = level
	var kept int64
	for now := t0; now.Before(t0.Add(90 * time.Second)); now = now.Add(step) {
		b.clock.Set(now)
		level = min(otpm, level+int64(now.Sub(last))*otpm/int64(time.Minute))
		last = now
		keep := pending[:0]
		for _, c := range pending {
			if !c.sent && !c.at.After(now) {
				// Arrives: charged max_tokens.
				c.sent = true
				level -= reserve
				low = min(low, level)
			}
			if c.sent && !c.at.Add(latency).After(now) {
				// Ends: the provider gives back what it did not use, the
				// executor rewinds as much.
				level += reserve - use
				if now.After(t0.Add(30 * time.Second)) {
					kept += use
				}
				if err := b.store.ReturnRewind(ctx, key, c.at, budget.Cost{Output: reserve - use}, lim); err != nil {
					t.Fatal(err)
				}
				continue
			}
			keep = append(keep, c)
		}
		pending = keep
		g, err := b.store.Take(ctx, key, lim, []budget.Cost{{Requests: 1, Tokens: 200, Output: reserve}})
		if err != nil {
			t.Fatal(err)
		}
		for _, at := range g.SendAt {
			pending = append(pending, call{at: at})
		}
	}
	return float64(kept) / otpm, low
}
