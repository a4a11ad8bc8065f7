package bench

import (
	"context"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestLimiterPacesRequests(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter(120, 0) // 2 per second, capacity 2
		start := time.Now()
		for range 6 {
			if err := l.Wait(t.Context(), 0); err != nil {
				t.Fatal(err)
			}
		}
		// Two from the full bucket at once, then one every 500 ms.
		if got, want := time.Since(start), 2*time.Second; got != want {
			t.Errorf("6 requests at 120 RPM took %v, want %v", got, want)
		}
	})
}

func TestLimiterIsFIFO(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter(60, 0) // 1 per second
		var mu sync.Mutex
		var order []int
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := l.Wait(t.Context(), 0); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
			}()
			synctest.Wait() // goroutine i has reserved before i+1 starts
		}
		wg.Wait()
		for i, got := range order {
			if got != i {
				t.Fatalf("grant order %v, want 0..4 in order", order)
			}
		}
	})
}

func TestTokenBucketDebt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter(0, 600) // 10 tokens per second, capacity 10
		// Larger than the capacity: granted at once from a full bucket,
		// leaving a debt of 40.
		if d := l.Reserve(50); d != 0 {
			t.Errorf("first 50-token reserve waits %v, want 0", d)
		}
		// 5 more need the debt repaid plus 5: 4.5 s.
		if got, want := l.Reserve(5), 4500*time.Millisecond; got != want {
			t.Errorf("5-token reserve after a debt of 40 waits %v, want %v", got, want)
		}
		time.Sleep(10 * time.Second) // synctest's virtual time: the refill is the logic
		// 10 s refilled 100 but the level is capped at the capacity.
		if got := l.tokens.Level(time.Now()); got != 10 {
			t.Errorf("level after a long idle = %v, want the capacity 10", got)
		}
	})
}

func TestLimiterGrantsBothBucketsTogether(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter(60, 600) // 1 request/s (cap 1), 10 tokens/s (cap 10)
		if d := l.Reserve(10); d != 0 {
			t.Fatalf("first reserve waits %v, want 0", d)
		}
		// Requests bind (1 s); the token bucket, empty, needs 0.2 s for 2.
		if got, want := l.Reserve(2), time.Second; got != want {
			t.Errorf("second reserve waits %v, want %v", got, want)
		}
		// At the grant (t=1s) the token bucket held min(10, 0+10) = 10,
		// minus 2: 8. Seen from now (t=0) that is 8 - 10 = -2.
		if got := l.tokens.Level(time.Now()); math.Abs(got-(-2)) > 1e-9 {
			t.Errorf("token level now = %v, want -2", got)
		}
		time.Sleep(time.Second) // synctest's virtual time: the refill is the logic
		if got := l.tokens.Level(time.Now()); math.Abs(got-8) > 1e-9 {
			t.Errorf("token level at the grant = %v, want 8", got)
		}
	})
}

func TestRefundIsCapped(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter(0, 1200) // 20 tokens/s, capacity 20
		l.Reserve(15)
		l.Refund(5)
		if got := l.tokens.Level(time.Now()); got != 10 {
			t.Errorf("level after take 15, refund 5 = %v, want 10", got)
		}
		l.Refund(1000)
		if got := l.tokens.Level(time.Now()); got != 20 {
			t.Errorf("level after a large refund = %v, want the capacity 20", got)
		}
	})
}

func TestWaitCancelledHandsBack(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter(60, 0)
		l.Reserve(0) // the bucket is empty now
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		if err := l.Wait(ctx, 0); err == nil {
			t.Fatal("Wait outlived its context")
		}
		// The cancelled reservation was handed back: the next one waits
		// only for the refill since the start (0.9 s left), not 1.9 s.
		if got, want := l.Reserve(0), 900*time.Millisecond; got != want {
			t.Errorf("reserve after a cancelled wait waits %v, want %v", got, want)
		}
	})
}
