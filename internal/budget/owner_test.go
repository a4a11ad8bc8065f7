package budget_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/streams"
)

// proc is one process's view of the budgets: its own connection, store
// and (unless direct) owner routing, with the paths its writes took.
type proc struct {
	nc     *nats.Conn
	kv     jetstream.KeyValue
	st     *budget.Store
	owners *budget.Owners
	paths  sync.Map // path -> *atomic.Int64
	stop   func()   // ends its Owners.Run and waits for it
}

func (p *proc) n(path string) int64 {
	v, _ := p.paths.LoadOrStore(path, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

// budgetsKV binds (or makes) the budgets bucket over nc.
func budgetsKV(tb testing.TB, nc *nats.Conn) jetstream.KeyValue {
	tb.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	cfgs, err := streams.Buckets()
	if err != nil {
		tb.Fatal(err)
	}
	for _, c := range cfgs {
		if c.Bucket == streams.BucketBudgets {
			kv, err := js.CreateOrUpdateKeyValue(context.Background(), c)
			if err != nil {
				tb.Fatal(err)
			}
			return kv
		}
	}
	tb.Fatal("no budgets bucket")
	return nil
}

// newProc makes a process on srv; with ttl > 0 its writes go through the
// schedules' owners (its Owners run until stop or the test's end).
func newProc(tb testing.TB, srv *server.Server, ttl, wait time.Duration) *proc {
	tb.Helper()
	nc := natstest.Conn(tb, srv)
	p := &proc{nc: nc, kv: budgetsKV(tb, nc), stop: func() {}}
	p.st = budget.NewStore(p.kv, pacedParams, nil)
	if ttl == 0 {
		return p
	}
	p.owners = budget.NewOwners(p.st, nc, p.kv, slog.New(slog.DiscardHandler))
	p.owners.TTL, p.owners.Wait = ttl, wait
	p.owners.Count = func(path string, n int) {
		v, _ := p.paths.LoadOrStore(path, new(atomic.Int64))
		v.(*atomic.Int64).Add(int64(n))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.owners.Run(ctx) }()
	var once sync.Once
	p.stop = func() { once.Do(func() { cancel(); <-done }) }
	tb.Cleanup(p.stop)
	return p
}

var ownerLim = budget.Limits{RPM: 6_000_000, TPM: 600_000_000}

// takeOne reserves one request of 100 tokens on key through p.
func takeOne(t *testing.T, p *proc, key string) budget.Grant {
	t.Helper()
	g, err := p.st.Take(context.Background(), key, ownerLim, []budget.Cost{{Requests: 1, Tokens: 100}})
	if err != nil || g.N != 1 {
		t.Fatalf("take: got N=%d (%q), %v; want 1", g.N, g.Reason, err)
	}
	return g
}

// becomeOwner has p take on key until it serves the schedule itself,
// and returns how many it took.
func becomeOwner(t *testing.T, p *proc, key string) int {
	t.Helper()
	n := 0
	natstest.Eventually(t, 10*time.Second, func() error {
		takeOne(t, p, key)
		n++
		if p.n(budget.PathServed) == 0 {
			return errors.New("not the owner yet")
		}
		return nil
	})
	return n
}

// TestOwnerServes has one process own a schedule and another ask it: the
// other's placements and give-backs are applied by the owner, in the KV.
func TestOwnerServes(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	key := budget.ModelKey("openai", "owned")
	a := newProc(t, srv, time.Minute, time.Second)
	taken := becomeOwner(t, a, key)
	b := newProc(t, srv, time.Minute, time.Second)
	var gs []budget.Grant
	for range 5 {
		gs = append(gs, takeOne(t, b, key))
	}
	taken += 5
	if got := b.n(budget.PathForwarded); got != 5 {
		t.Fatalf("b forwarded %d placements, want 5 (fallback %d)", got, b.n(budget.PathFallback))
	}
	if err := b.st.ReturnAt(context.Background(), key, gs[0].SendAt[0], budget.Cost{Requests: 1, Tokens: 100}); err != nil {
		t.Fatal(err)
	}
	if got := b.n(budget.PathForwarded); got != 6 {
		t.Fatalf("b forwarded %d writes after a give-back, want 6", got)
	}
	used, err := a.st.Used(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if want := taken - 1; used.Requests != want || used.Tokens != 100*want {
		t.Fatalf("the schedule holds %d requests, %d tokens; want %d, %d", used.Requests, used.Tokens, want, 100*want)
	}
	if a.n(budget.PathServed) < 6 {
		t.Fatalf("a served %d writes, want b's 6 and its own", a.n(budget.PathServed))
	}
	// A malformed write is refused, never applied.
	m, err := b.nc.Request(budget.OwnerSubject(key), []byte(`{"k":"take","costs":[{"Requests":-5}]}`), 5*time.Second)
	if err != nil || string(m.Data) != `{"err":"malformed write"}` {
		t.Fatalf("a negative cost: got %v %q, want a refusal", err, m.Data)
	}
}

// TestOwnerNeverOverAdmits is a property over the schedule: four
// processes place and give back at random on one model near its limits:
// two owners at once (a handover), one asking them, one writing the KV
// itself. The calls sent at their instants (those not given back) must
// pass a provider that enforces the minute and the second.
func TestOwnerNeverOverAdmits(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	key := budget.ModelKey("openai", "property")
	lim := budget.Limits{RPM: 600, TPM: 30_000} // 10 requests, 500 tokens a second
	owner := newProc(t, srv, time.Minute, time.Second)
	becomeOwnerOf(t, owner, key, lim)
	second := newProc(t, srv, time.Minute, time.Second)
	natstest.Eventually(t, 5*time.Second, func() error {
		if !second.owners.Own(key) {
			return errors.New("the second owner does not serve")
		}
		return nil
	})
	procs := []*proc{owner, second, newProc(t, srv, time.Minute, time.Second), newProc(t, srv, 0, 0)}
	var mu sync.Mutex
	sent := map[time.Time][]budget.Cost{}
	var wg sync.WaitGroup
	var refused atomic.Int64
	for i, p := range procs {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(i), 39))
			for range 150 {
				if err := step(p, key, lim, rnd, &mu, sent, &refused); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	var sends []send
	for at, cs := range sent {
		for _, c := range cs {
			sends = append(sends, send{at: at, r: c.Requests, t: c.Tokens})
		}
	}
	if len(sends) < 10 || refused.Load() == 0 {
		t.Fatalf("%d calls placed, %d refused: want the limits reached", len(sends), refused.Load())
	}
	if refused := strictProvider(sends, lim.RPM, lim.TPM); refused > 0 {
		t.Fatalf("the provider refuses %d of %d calls", refused, len(sends))
	}
	if procs[2].n(budget.PathForwarded) == 0 || owner.n(budget.PathServed) == 0 || second.n(budget.PathServed) == 0 {
		t.Fatalf("forwarded %d, served %d and %d: want every path used", procs[2].n(budget.PathForwarded), owner.n(budget.PathServed), second.n(budget.PathServed))
	}
}

// becomeOwnerOf makes p the owner of key with placements it gives back.
func becomeOwnerOf(t *testing.T, p *proc, key string, lim budget.Limits) {
	t.Helper()
	ctx := context.Background()
	natstest.Eventually(t, 10*time.Second, func() error {
		g, err := p.st.Take(ctx, key, lim, []budget.Cost{{Requests: 1, Tokens: 10}})
		if err != nil {
			return err
		}
		if g.N == 1 {
			if err := p.st.ReturnAt(ctx, key, g.SendAt[0], budget.Cost{Requests: 1, Tokens: 10}); err != nil {
				return err
			}
		}
		if p.n(budget.PathServed) == 0 {
			return errors.New("not the owner yet")
		}
		return nil
	})
}

// step places one to three calls and gives back (unsent, lapsed or not)
// a random one of them at times; sent keeps what is left, by instant,
// refused counts the placements not granted whole.
func step(p *proc, key string, lim budget.Limits, rnd *rand.Rand, mu *sync.Mutex, sent map[time.Time][]budget.Cost, refused *atomic.Int64) error {
	ctx := context.Background()
	costs := make([]budget.Cost, 1+rnd.IntN(3))
	for i := range costs {
		costs[i] = budget.Cost{Requests: 1, Tokens: 10 + rnd.IntN(90)}
	}
	g, err := p.st.Take(ctx, key, lim, costs)
	if g.N < len(costs) {
		refused.Add(1)
	}
	if err != nil || g.N == 0 {
		return err
	}
	i := rnd.IntN(g.N)
	if rnd.IntN(3) == 0 {
		// Given back before it is recorded as sent: the room it frees
		// may be placed again at once.
		rs := []budget.Return{{At: g.SendAt[i], Cost: costs[i]}}
		if err := p.st.ReturnAll(ctx, key, rs, rnd.IntN(2) == 0); err != nil {
			return err
		}
	} else {
		i = -1
	}
	mu.Lock()
	defer mu.Unlock()
	for j := range g.N {
		if j != i {
			sent[g.SendAt[j]] = append(sent[g.SendAt[j]], costs[j])
		}
	}
	return nil
}

// TestOwnerKilledTakesOver: the owner dies (its connection drops, its
// record stays); the asker writes the KV itself meanwhile and takes the
// schedule over once the record has stood still a TTL. No placement is
// lost or counted twice.
func TestOwnerKilledTakesOver(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	key := budget.ModelKey("openai", "killed")
	a := newProc(t, srv, 300*time.Millisecond, time.Second)
	taken := becomeOwner(t, a, key)
	b := newProc(t, srv, 300*time.Millisecond, time.Second)
	for range 3 {
		takeOne(t, b, key)
		taken++
	}
	if b.n(budget.PathForwarded) != 3 {
		t.Fatalf("b forwarded %d, want 3", b.n(budget.PathForwarded))
	}
	a.nc.Close() // killed: no give-up, the record lapses
	natstest.Eventually(t, 10*time.Second, func() error {
		takeOne(t, b, key)
		taken++
		if b.n(budget.PathServed) == 0 {
			return fmt.Errorf("b has not taken over (fell back %d times)", b.n(budget.PathFallback))
		}
		return nil
	})
	if b.n(budget.PathFallback) == 0 {
		t.Fatal("b never wrote the KV itself while no one owned the schedule")
	}
	used, err := b.st.Used(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if used.Requests != taken {
		t.Fatalf("the schedule holds %d requests, want the %d placed", used.Requests, taken)
	}
}

// TestOwnerSilentFallback: an owner that never answers (hung) costs an
// asker Wait; then it places (and settles) in the KV itself, and leaves
// a give-back spent.
func TestOwnerSilentFallback(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	key := budget.ModelKey("openai", "silent")
	hung := natstest.Conn(t, srv)
	if _, err := budgetsKV(t, hung).Create(context.Background(), keys.ScheduleOwner(key), []byte(`{"holder":"hung"}`)); err != nil {
		t.Fatal(err)
	}
	var heard atomic.Int64
	if _, err := hung.QueueSubscribe(budget.OwnerSubject(key), "owner", func(*nats.Msg) { heard.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := hung.Flush(); err != nil {
		t.Fatal(err)
	}
	b := newProc(t, srv, time.Minute, 50*time.Millisecond)
	g := takeOne(t, b, key)
	if err := b.st.ReturnAt(context.Background(), key, g.SendAt[0], budget.Cost{Tokens: 60}); err != nil {
		t.Fatal(err)
	}
	if err := b.st.Settle(context.Background(), key, g.Slice, budget.Cost{Tokens: 7}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		if n := heard.Load(); n != 3 {
			return fmt.Errorf("the hung owner heard %d writes, want 3", n)
		}
		return nil
	})
	if b.n(budget.PathFallback) != 2 || b.n(budget.PathDropped) != 1 || b.n(budget.PathForwarded) != 0 {
		t.Fatalf("fallback %d, dropped %d, forwarded %d; want 2, 1, 0",
			b.n(budget.PathFallback), b.n(budget.PathDropped), b.n(budget.PathForwarded))
	}
	used, err := b.st.Used(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if used.Requests != 1 || used.Tokens != 107 {
		t.Fatalf("the schedule holds %d requests, %d tokens; want 1, 107 (the give-back left spent)", used.Requests, used.Tokens)
	}
}

// TestOwnerStopsHandsOver: an owner that stops deletes its record, and
// the asker creates it and owns the schedule at its next election. No
// placement is lost.
func TestOwnerStopsHandsOver(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	key := budget.ModelKey("openai", "handed")
	a := newProc(t, srv, time.Minute, time.Second)
	taken := becomeOwner(t, a, key)
	b := newProc(t, srv, 300*time.Millisecond, time.Second)
	takeOne(t, b, key)
	taken++
	a.stop()
	if _, err := a.kv.Get(context.Background(), keys.ScheduleOwner(key)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a stopped: its record: %v, want deleted", err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		takeOne(t, b, key)
		taken++
		if b.n(budget.PathServed) == 0 {
			return errors.New("b does not own the schedule yet")
		}
		return nil
	})
	used, err := b.st.Used(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if used.Requests != taken {
		t.Fatalf("the schedule holds %d requests, want the %d placed", used.Requests, taken)
	}
}
