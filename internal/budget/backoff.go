package budget

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// # Contention
//
// A lost compare-and-set means another process wrote the key between this
// one's read and its write. Retried at once, every loser reads and writes
// again together with the others: on a starved machine (the three-node
// cluster beside a second test suite) the writers of one model's schedule
// kept colliding until each gave up after 51 losses in a row, and the fleet
// fell to a few jobs a second. So a store waits before each retry, a random
// time below a ceiling that starts at conflictBase and doubles up to
// conflictCap ("full jitter": the losers spread out instead of colliding
// again), and gives up, failing closed, once it has waited
// conflictPatience in all or that long has passed since its first loss. A
// context that ends stops the wait.

const (
	conflictBase     = time.Millisecond
	conflictCap      = 50 * time.Millisecond
	conflictPatience = 5 * time.Second
)

// backoff is the waiting of one operation on a contended key.
type backoff struct {
	sleep  func(context.Context, time.Duration) error
	now    func() time.Time
	lost   int // compare-and-sets lost
	waited time.Duration
	start  time.Time
}

func (s *Store) backoff() backoff {
	sleep := s.Sleep
	if sleep == nil {
		sleep = sleepCtx
	}
	// Patience is the real time an operation waited on a contended key,
	// not the schedule's clock (s.now), which a test or a replay may move
	// by seconds between two tries.
	return backoff{sleep: sleep, now: time.Now}
}

// ceiling is the bound of the wait after the n-th loss (n from 1).
func ceiling(n int) time.Duration {
	return min(conflictCap, conflictBase<<min(n-1, 16))
}

// wait is called after a lost compare-and-set: it waits before the next
// try, or returns the error that ends the operation (wrapping
// ErrUnavailable) when the store has been patient enough or ctx ended.
func (b *backoff) wait(ctx context.Context, what, key string) error {
	b.lost++
	if b.lost == 1 {
		b.start = b.now()
	}
	if b.waited >= conflictPatience || b.now().Sub(b.start) >= conflictPatience {
		return fmt.Errorf("%w: %s %s: lost %d compare-and-sets in a row (waited %v between them)",
			ErrUnavailable, what, key, b.lost, b.waited.Round(time.Millisecond))
	}
	d := rand.N(ceiling(b.lost))
	b.waited += d
	if err := b.sleep(ctx, d); err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrUnavailable, what, key, err)
	}
	return nil
}

// sleepCtx waits d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
