package budget_test

import (
	"context"
	"encoding/json"
	"testing"

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
