package budget_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/natstest"
)

// BenchmarkWriters measures reservations per second on one model's paced
// schedule in a real embedded JetStream KV, against the number of
// writers: each its own connection and Store (a process: admission or
// executor). per-call: each reserves one call with a compare-and-set and
// gives back part of its tokens at its instant with another, as an
// executor settling it does. batched: each reserves as a backlogged
// admission process does (budget.Lease: the job and room for 32 more in
// one compare-and-set, spent locally) and gives back what its 33 calls did
// not use in one write, as the executors' coalescing does when calls end
// together. owner: each reserves and gives back per call as per-call
// does, through the schedule's owner (the first writer; owner.go), which
// applies what all ask in one compare-and-set. It reports reservations/s,
// and lost and successful compare-and-sets per reservation
// (docs/BENCHMARKS.md).
func BenchmarkWriters(b *testing.B) {
	for _, mode := range []string{"per-call", "batched", "owner"} {
		for _, n := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("%s/writers=%d", mode, n), func(b *testing.B) { benchWriters(b, n, mode) })
		}
	}
}

func benchWriters(b *testing.B, writers int, mode string) {
	ctx := context.Background()
	srv := natstest.Server(b)
	stores := make([]*budget.Store, writers)
	var conflicts, writes atomic.Int64
	key := budget.ModelKey("openai", "bench")
	// Limits far above what the writers reach: the store, not the limit,
	// bounds the rate.
	lim := budget.Limits{RPM: 6_000_000, TPM: 600_000_000}
	cost := []budget.Cost{{Requests: 1, Tokens: 100}}
	for i := range stores {
		ttl := time.Duration(0)
		if mode == "owner" {
			ttl = time.Minute
		}
		p := newProc(b, srv, ttl, time.Second)
		stores[i] = p.st
		stores[i].Conflicts = func() { conflicts.Add(1) }
		stores[i].Writes = func() { writes.Add(1) }
		if i == 0 && mode == "owner" {
			// The first writer owns the schedule before the clock starts.
			natstest.Eventually(b, 10*time.Second, func() error {
				if err := perCall(ctx, p.st, key, lim, cost[0]); err != nil {
					return err
				}
				if p.n(budget.PathServed) == 0 {
					return errors.New("not the owner yet")
				}
				return nil
			})
		}
	}
	writes.Store(0)
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	for _, st := range stores {
		wg.Go(func() {
			write := perCall
			if mode == "batched" {
				write = leased(budget.NewLease(st, key))
			}
			for left.Add(-1) >= 0 {
				if err := write(ctx, st, key, lim, cost[0]); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reservations/s")
	b.ReportMetric(float64(conflicts.Load())/float64(b.N), "conflicts/reservation")
	b.ReportMetric(float64(writes.Load())/float64(b.N), "writes/reservation")
	b.ReportMetric(0, "ns/op")
}

// perCall reserves c with one compare-and-set and gives 30 tokens back
// with another.
func perCall(ctx context.Context, st *budget.Store, key string, lim budget.Limits, c budget.Cost) error {
	g, err := st.Take(ctx, key, lim, []budget.Cost{c})
	if err == nil && g.N != 1 {
		err = fmt.Errorf("not granted: %q", g.Reason)
	}
	if err != nil {
		return err
	}
	return st.ReturnAt(ctx, key, g.SendAt[0], budget.Cost{Tokens: 30})
}

// leased reserves c from the lease's blocks, taking the job and room for
// 32 more with one compare-and-set when none is left, and gives back 30
// tokens of each of the block's calls in one write once they are spent.
func leased(l *budget.Lease) func(context.Context, *budget.Store, string, budget.Limits, budget.Cost) error {
	var back []budget.Return
	return func(ctx context.Context, st *budget.Store, key string, lim budget.Limits, c budget.Cost) error {
		now := time.Now()
		if b, ok := l.Spend(c, false, now, 0); ok {
			back = append(back, budget.Return{At: b.At, Cost: budget.Cost{Tokens: 30}})
			return nil
		}
		if len(back) > 0 {
			if err := st.ReturnAll(ctx, key, back, false); err != nil {
				return err
			}
			back = back[:0]
		}
		extra := make([]budget.Cost, 32)
		for i := range extra {
			extra[i] = c
		}
		g, err := l.Take(ctx, lim, []budget.Cost{c}, extra, false, 0)
		if err == nil && g.N != 1 {
			err = fmt.Errorf("not granted: %q", g.Reason)
		}
		if err != nil {
			return err
		}
		back = append(back, budget.Return{At: g.SendAt[0], Cost: budget.Cost{Tokens: 30}})
		return nil
	}
}
