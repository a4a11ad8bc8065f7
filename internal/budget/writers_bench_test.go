package budget_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/streams"
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
// together. It reports reservations/s and lost compare-and-sets per
// reservation (docs/BENCHMARKS.md).
func BenchmarkWriters(b *testing.B) {
	for _, batched := range []bool{false, true} {
		for _, n := range []int{1, 2, 4, 8} {
			name := fmt.Sprintf("per-call/writers=%d", n)
			if batched {
				name = fmt.Sprintf("batched/writers=%d", n)
			}
			b.Run(name, func(b *testing.B) { benchWriters(b, n, batched) })
		}
	}
}

func benchWriters(b *testing.B, writers int, batched bool) {
	ctx := context.Background()
	srv := natstest.Server(b)
	cfgs, err := streams.Buckets()
	if err != nil {
		b.Fatal(err)
	}
	stores := make([]*budget.Store, writers)
	var conflicts atomic.Int64
	for i := range stores {
		js, err := jetstream.New(natstest.Conn(b, srv))
		if err != nil {
			b.Fatal(err)
		}
		var kv jetstream.KeyValue
		for _, c := range cfgs {
			if c.Bucket == streams.BucketBudgets {
				kv, err = js.CreateOrUpdateKeyValue(ctx, c)
			}
		}
		if err != nil || kv == nil {
			b.Fatalf("budgets bucket: %v", err)
		}
		stores[i] = budget.NewStore(kv, pacedParams, nil)
		stores[i].Conflicts = func() { conflicts.Add(1) }
	}
	// Limits far above what the writers reach: the store, not the limit,
	// bounds the rate.
	lim := budget.Limits{RPM: 6_000_000, TPM: 600_000_000}
	cost := []budget.Cost{{Requests: 1, Tokens: 100}}
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	key := budget.ModelKey("openai", "bench")
	for _, st := range stores {
		wg.Go(func() {
			write := perCall
			if batched {
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
