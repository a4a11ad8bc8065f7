package budget_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
)

const period = 3 * time.Second

func pool(kv *fakeKV, holder string, limit int) *budget.Pool {
	return budget.NewPool(kv, budget.ConcKey("p", "m"), holder, limit, period, nil)
}

func TestPoolLeaseGrowsExpiresAndReturns(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		kv := newFakeKV()
		p := pool(kv, "a", 10)
		if p.TryAcquire() {
			t.Fatal("a slot without a lease")
		}
		if err := p.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if held, _ := p.Held(); held != 1 {
			t.Fatalf("first lease holds %d, want 1 (demand was one waiter)", held)
		}
		// Saturated: demand doubles the lease at each renewal, up to the limit.
		for range 6 {
			for p.TryAcquire() {
			}
			if err := p.Renew(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if held, inUse := p.Held(); held != 10 || inUse != 10 {
			t.Fatalf("saturated lease: held %d in use %d, want 10 and 10", held, inUse)
		}
		// No renewal: the lease expires and no new call may start.
		for range 10 {
			p.Release()
		}
		time.Sleep(period + time.Millisecond) // synctest's virtual time: the lease period is the logic
		if p.TryAcquire() {
			t.Error("acquired a slot on an expired lease")
		}
		// Return removes the holder; another can take everything.
		if err := p.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.Return(ctx); err != nil {
			t.Fatal(err)
		}
		q := pool(kv, "b", 10)
		for range 5 {
			for q.TryAcquire() {
			}
			_ = q.Renew(ctx)
		}
		if held, _ := q.Held(); held != 10 {
			t.Errorf("after a returned lease the other holder got %d, want 10", held)
		}
	})
}

func TestPoolDeadHolderLosesSlotsAtExpiry(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		kv := newFakeKV()
		dead, live := pool(kv, "dead", 8), pool(kv, "live", 8)
		for range 5 {
			for dead.TryAcquire() {
			}
			_ = dead.Renew(ctx)
		}
		if held, _ := dead.Held(); held != 8 {
			t.Fatalf("dead holder leased %d, want all 8", held)
		}
		// While the dead holder's lease runs, the other gets nothing.
		live.TryAcquire()
		_ = live.Renew(ctx)
		if held, _ := live.Held(); held != 0 {
			t.Fatalf("live holder got %d slots while 8 of 8 are leased", held)
		}
		// The dead holder never renews; after its period the slots come back.
		time.Sleep(period + time.Millisecond) // synctest's virtual time: the lease period is the logic
		for range 5 {
			for live.TryAcquire() {
			}
			_ = live.Renew(ctx)
		}
		if held, _ := live.Held(); held != 8 {
			t.Errorf("after the dead holder's expiry the live one holds %d, want 8", held)
		}
	})
}

func TestPoolRunRenewsAndReturnsOnStop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		kv := newFakeKV()
		p := pool(kv, "a", 4)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { p.Run(ctx, nil); close(done) }()
		if err := p.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		// Holding a slot across many periods: Run keeps the lease alive.
		time.Sleep(5 * period) // synctest's virtual time: the lease period is the logic
		if held, inUse := p.Held(); held < 1 || inUse != 1 {
			t.Fatalf("after 5 periods: held %d in use %d, want a live lease", held, inUse)
		}
		p.Release()
		cancel()
		<-done
		if held, _ := p.Held(); held != 0 {
			t.Errorf("after stop the pool still holds %d", held)
		}
		if v := kv.value(budget.ConcKey("p", "m")); string(v) != `{"h":{}}` {
			t.Errorf("after stop the key holds %s, want no holders", v)
		}
	})
}

// Randomized: holders that renew, stall, die and return never hold more
// than the limit among unexpired leases, and nobody uses more than it holds.
func TestPoolNeverOverTheLimit(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		kv := newFakeKV()
		const limit = 12
		rnd := rand.New(rand.NewPCG(7, 11))
		pools := make([]*budget.Pool, 5)
		for i := range pools {
			pools[i] = pool(kv, fmt.Sprint("h", i), limit)
		}
		for step := range 3000 {
			p := pools[rnd.IntN(len(pools))]
			switch r := rnd.IntN(10); {
			case r < 4:
				p.TryAcquire()
			case r < 7:
				p.Release()
			case r < 9:
				_ = p.Renew(ctx)
			default:
				if rnd.IntN(20) == 0 {
					_ = p.Return(ctx)
				}
			}
			time.Sleep(time.Duration(rnd.IntN(400)) * time.Millisecond) // synctest's virtual time: leases expire between steps
			total := 0
			for _, q := range pools {
				held, inUse := q.Held()
				if inUse > held && held > 0 {
					t.Fatalf("step %d: a holder uses %d slots but holds %d", step, inUse, held)
				}
				total += held
			}
			if total > limit {
				t.Fatalf("step %d: unexpired leases add up to %d, limit %d", step, total, limit)
			}
		}
	})
}

// TestPoolKeepsPeakAndSpare: a lease does not shrink below the peak use
// since the last renewal, and keeps a quarter spare, so a call arriving
// during the next burst does not wait for a renewal.
func TestPoolKeepsPeakAndSpare(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		p := pool(newFakeKV(), "a", 100)
		for range 6 {
			for p.TryAcquire() {
			}
			if err := p.Renew(ctx); err != nil {
				t.Fatal(err)
			}
		}
		_, inUse := p.Held()
		if inUse < 16 {
			t.Fatalf("saturating calls hold %d slots, want at least 16", inUse)
		}
		peak := inUse
		// The burst ends: two calls stay.
		for range inUse - 2 {
			p.Release()
		}
		if err := p.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if held, _ := p.Held(); held != peak+peak/4 {
			t.Errorf("after a burst of %d: held %d, want the peak plus a quarter (%d)", peak, held, peak+peak/4)
		}
		// A quiet period: the lease follows use down, still with a spare.
		if err := p.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if held, _ := p.Held(); held != 2 {
			t.Errorf("after a quiet period with 2 calls: held %d, want 2 (2 plus a quarter, rounded down)", held)
		}
	})
}
