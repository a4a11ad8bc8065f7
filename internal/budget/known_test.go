package budget_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
)

// TestPlacesOnTheWindowItWrote: a store whose write is the newest places
// without reading the window; a write by another store makes its copy
// stale, and the next placement still sees it (the compare-and-set refuses
// the copy); a store whose copies keep going stale reads first; a refusal
// is never made on a copy alone.
func TestPlacesOnTheWindowItWrote(t *testing.T) {
	t.Parallel()
	p := budget.Params{Slice: 250 * time.Millisecond, BurstFraction: 1.0 / 60, Short: time.Second,
		Lead: 2 * time.Millisecond, Tolerance: 15 * time.Millisecond, Horizon: 2 * time.Second}
	b := setup(t, p)
	var gets atomic.Int64
	b.kv.beforeGet = func(string) { gets.Add(1) }
	other := budget.NewStore(b.kv, p, b.clock.Now)
	lim := budget.Limits{RPM: 600} // one call every 100 ms
	one := []budget.Cost{{Requests: 1}}
	take := func(st *budget.Store, what string) time.Time {
		t.Helper()
		g, err := st.Take(t.Context(), key, lim, one)
		if err != nil || g.N != 1 {
			t.Fatalf("%s: got N=%d err %v, want 1", what, g.N, err)
		}
		return g.SendAt[0]
	}

	first := take(b.store, "first")
	if n := gets.Load(); n != 1 {
		t.Fatalf("first placement: %d reads, want 1", n)
	}
	b.clock.Advance(10 * time.Millisecond)
	second := take(b.store, "second")
	if n := gets.Load(); n != 1 {
		t.Errorf("placement on the window it wrote: %d reads in all, want still 1", n)
	}
	if second.Sub(first) < 100*time.Millisecond {
		t.Errorf("second placed %v after the first, want at least 100 ms (pacing)", second.Sub(first))
	}

	// Another process places: this store's copy is stale, and its next
	// placement comes after the other's.
	third := take(other, "other")
	_, conflicts0 := b.kv.stats()
	fourth := take(b.store, "after another's write")
	if _, conflicts := b.kv.stats(); conflicts != conflicts0+1 {
		t.Errorf("stale copy: %d refused writes, want 1", conflicts-conflicts0)
	}
	if fourth.Sub(third) < 100*time.Millisecond {
		t.Errorf("placed %v after another process's placement, want at least 100 ms", fourth.Sub(third))
	}

	// Two stores writing in turn: copies go stale every time, and the
	// stores soon read first instead of losing a write each time.
	for range 10 {
		b.clock.Advance(200 * time.Millisecond)
		take(other, "in turn")
		take(b.store, "in turn")
	}
	_, conflicts0 = b.kv.stats()
	for range 10 {
		b.clock.Advance(200 * time.Millisecond)
		take(other, "in turn")
		take(b.store, "in turn")
	}
	if _, conflicts := b.kv.stats(); conflicts != conflicts0 {
		t.Errorf("stores writing in turn: %d refused writes in the last 20 placements, want 0", conflicts-conflicts0)
	}

	// A copy with less room than the window: one request a minute is
	// placed, an executor lets it lapse and gives it back, and this
	// store's next placement sees the room its copy does not.
	b2 := setup(t, p)
	other2 := budget.NewStore(b2.kv, p, b2.clock.Now)
	full := budget.Limits{RPM: 1}
	g, err := b2.store.Take(t.Context(), key, full, one)
	if err != nil || g.N != 1 {
		t.Fatalf("placing: got N=%d err %v", g.N, err)
	}
	b2.clock.Advance(time.Second)
	if err := other2.ReturnLapsed(t.Context(), key, g.SendAt[0], budget.Cost{Requests: 1}); err != nil {
		t.Fatal(err)
	}
	if g, err := b2.store.Take(t.Context(), key, full, []budget.Cost{{Requests: 1}}); err != nil || g.N != 1 {
		t.Errorf("after another's return: got N=%d err %v, want 1 (refused on a stale copy)", g.N, err)
	}
}
