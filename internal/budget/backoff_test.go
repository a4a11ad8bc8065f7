package budget_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
)

// waits records the store's backoff without waiting.
type waits struct {
	mu sync.Mutex
	d  []time.Duration
}

func (w *waits) sleep(ctx context.Context, d time.Duration) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.d = append(w.d, d)
	return ctx.Err()
}

func (w *waits) all() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]time.Duration(nil), w.d...)
}

// check reports a wait above its jittered ceiling (doubling from the
// base to the cap), and returns the total waited.
func (w *waits) check(t *testing.T, what string) time.Duration {
	t.Helper()
	var total time.Duration
	for i, d := range w.all() {
		ceil := min(budget.ConflictCap, budget.ConflictBase<<min(i, 16))
		if d < 0 || d >= ceil {
			t.Errorf("%s: wait %d is %v, want in [0, %v)", what, i+1, d, ceil)
		}
		total += d
	}
	return total
}

// A store that keeps losing its compare-and-sets waits between them
// (bounded, jittered, growing) and gives up only once it has waited its
// patience, with ErrUnavailable: Take and every modification alike.
func TestConflictBackoffGivesUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, noBurst)
	k := b.at(0, 0)
	if _, err := b.store.Take(ctx, key, budget.Limits{}, costs(1, budget.Cost{Requests: 1})); err != nil {
		t.Fatal(err)
	}
	// Someone else writes between every read and write.
	b.kv.beforeUpdate = func(key string) { b.kv.set(key, b.kv.value(key)) }
	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"take", func() error {
			_, err := b.store.Take(ctx, key, budget.Limits{RPM: 10}, costs(1, budget.Cost{Requests: 1}))
			return err
		}},
		{"settle", func() error { return b.store.Settle(ctx, key, k, budget.Cost{Tokens: 1}) }},
		{"return", func() error { return b.store.Return(ctx, key, k, budget.Cost{Requests: 1}) }},
	} {
		w := &waits{}
		b.store.Sleep = w.sleep
		conflicts := 0
		b.store.Conflicts = func() { conflicts++ }
		err := op.do()
		if !errors.Is(err, budget.ErrUnavailable) {
			t.Errorf("%s: got %v, want an error wrapping ErrUnavailable", op.name, err)
		}
		total := w.check(t, op.name)
		if total < budget.ConflictPatience || total >= budget.ConflictPatience+budget.ConflictCap {
			t.Errorf("%s: waited %v in all, want [%v, %v)", op.name, total, budget.ConflictPatience, budget.ConflictPatience+budget.ConflictCap)
		}
		// Every loss but the last is followed by a wait.
		if n := len(w.all()); conflicts != n+1 {
			t.Errorf("%s: %d conflicts reported and %d waits, want one wait after each but the last", op.name, conflicts, n)
		}
	}
}

// When the conflicts stop, the store's next try goes through: Take grants
// on what the window holds then, and a settlement is written once.
func TestConflictBackoffRecovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, noBurst)
	k := b.at(0, 0)
	lim := budget.Limits{RPM: 100}
	// Another process wrote the window (this store keeps no copy of it).
	other := budget.NewStore(b.kv, b.p, b.clock.Now)
	if _, err := other.Take(ctx, key, lim, costs(1, budget.Cost{Requests: 1})); err != nil {
		t.Fatal(err)
	}
	const lose = 20
	var mu sync.Mutex
	interfered := 0
	b.kv.beforeUpdate = func(key string) {
		mu.Lock()
		n := interfered
		interfered++
		mu.Unlock()
		if n < lose {
			b.kv.set(key, b.kv.value(key)) // someone else writes in between
		}
	}
	w := &waits{}
	b.store.Sleep = w.sleep
	conflicts := 0
	b.store.Conflicts = func() { conflicts++ }
	g, err := b.store.Take(ctx, key, lim, costs(2, budget.Cost{Requests: 1}))
	if err != nil || g.N != 2 {
		t.Fatalf("Take after %d lost compare-and-sets: got N=%d err=%v, want N=2", lose, g.N, err)
	}
	w.check(t, "take")
	if conflicts != lose || len(w.all()) != lose {
		t.Errorf("take: got %d conflicts and %d waits, want %d of each", conflicts, len(w.all()), lose)
	}
	if used, _ := b.store.Used(ctx, key); used.Requests != 3 {
		t.Errorf("Used: got %d requests, want 3 (the take written once)", used.Requests)
	}

	mu.Lock()
	interfered = 0
	mu.Unlock()
	writes, _ := b.kv.stats()
	if err := b.store.Settle(ctx, key, k, budget.Cost{Tokens: 7}); err != nil {
		t.Fatalf("Settle after %d lost compare-and-sets: %v", lose, err)
	}
	// The other process's writes, and one settlement.
	if after, _ := b.kv.stats(); after-writes != lose+1 {
		t.Errorf("Settle: %d writes, want %d (the other's %d and one)", after-writes, lose+1, lose)
	}
	if used, _ := b.store.Used(ctx, key); used.Tokens != 7 {
		t.Errorf("Used: got %d tokens, want 7", used.Tokens)
	}
}

// The wait between lost compare-and-sets ends with the caller's context.
func TestConflictBackoffHonoursContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := setup(t, noBurst)
	b.at(0, 0)
	if _, err := b.store.Take(ctx, key, budget.Limits{}, costs(1, budget.Cost{Requests: 1})); err != nil {
		t.Fatal(err)
	}
	b.kv.beforeUpdate = func(key string) { b.kv.set(key, b.kv.value(key)) }
	conflicts := 0
	// The default sleep: a timer that the context's end stops.
	b.store.Conflicts = func() {
		if conflicts++; conflicts == 3 {
			cancel()
		}
	}
	_, err := b.store.Take(ctx, key, budget.Limits{RPM: 10}, costs(1, budget.Cost{Requests: 1}))
	if !errors.Is(err, context.Canceled) || !errors.Is(err, budget.ErrUnavailable) {
		t.Errorf("Take: got %v, want an error wrapping context.Canceled and ErrUnavailable", err)
	}
	if conflicts != 3 {
		t.Errorf("Take: %d conflicts, want 3 (none after the context ended)", conflicts)
	}
}

// Patience is counted in real time: a schedule clock that jumps between two
// lost compare-and-sets (another process's fake clock in a test, a replay)
// does not make the store give up while conflicts are few.
func TestConflictPatienceIsRealTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, noBurst)
	b.at(0, 0)
	const lose = 3
	var mu sync.Mutex
	interfered := 0
	b.kv.beforeUpdate = func(key string) {
		mu.Lock()
		n := interfered
		interfered++
		mu.Unlock()
		if n < lose {
			b.clock.Advance(2 * budget.ConflictPatience) // the schedule's clock jumps
			b.kv.set(key, b.kv.value(key))               // and someone else writes in between
		}
	}
	b.store.Sleep = (&waits{}).sleep
	if _, err := b.store.Take(ctx, key, budget.Limits{}, costs(1, budget.Cost{Requests: 1})); err != nil {
		t.Fatalf("Take after %d lost compare-and-sets while the schedule's clock jumped: %v", lose, err)
	}
}
