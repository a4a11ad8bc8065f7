package budget_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/fakeclock"
)

// event is one request reaching the provider (or one grant).
type event struct {
	at       time.Time
	requests int64
	tokens   int64
}

type scenario struct {
	name   string
	lim    budget.Limits
	minTok int // each cost is 1 request and a uniform number of tokens
	maxTok int
	procs  int // processes sharing the bucket, each with its own Store
	ops    int // Take calls in all
	// maxStep bounds the random clock advance before each Take.
	maxStep time.Duration
	seed    uint64
	// storeGrace, when set, is the dispatch grace the stores are told
	// (instead of p.DispatchGrace, which the executors use): a broken setup
	// the checker must catch.
	storeGrace *time.Duration
}

type simResult struct {
	dispatched []event // at a random start time within [grant, ValidUntil]
	granted    []event // at grant time
	end        time.Time
	conflicts  int
}

// simulate runs sc.ops Takes from sc.procs backlogged processes on a shared
// fake bucket under a fake clock, and records when every granted request
// starts its provider call: at a random moment between its grant and its
// Grant.ValidUntil, a third of the time at one of the two ends.
func simulate(t *testing.T, p budget.Params, sc scenario) simResult {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(sc.seed, 0x5eed))
	kv := newFakeKV()
	clock := fakeclock.New(t0)
	sp := p
	if sc.storeGrace != nil {
		sp.DispatchGrace = *sc.storeGrace
	}
	stores := make([]*budget.Store, sc.procs)
	for i := range stores {
		stores[i] = budget.NewStore(kv, sp, clock.Now)
	}
	// Each process has a backlog it takes from the front of, in order.
	queues := make([][]budget.Cost, sc.procs)
	var res simResult
	for range sc.ops {
		now := clock.Advance(time.Duration(rng.Int64N(int64(sc.maxStep) + 1)))
		i := rng.IntN(sc.procs)
		for len(queues[i]) < 64 {
			queues[i] = append(queues[i], budget.Cost{Requests: 1, Tokens: sc.minTok + rng.IntN(sc.maxTok-sc.minTok+1)})
		}
		batch := queues[i][:1+rng.IntN(16)]
		g, err := stores[i].Take(ctx, key, sc.lim, batch)
		if err != nil {
			t.Fatalf("Take at %v: %v", now.Sub(t0), err)
		}
		cur := sliceOf(p, now)
		if g.Slice != cur {
			t.Fatalf("Take at %v: slice got %d, want %d", now.Sub(t0), g.Slice, cur)
		}
		if want := sliceStart(p, cur+1).Add(sp.DispatchGrace); !g.ValidUntil.Equal(want) {
			t.Fatalf("Take at %v: valid until got %v, want %v", now.Sub(t0), g.ValidUntil, want)
		}
		switch {
		case g.N == len(batch):
			if g.Reason != "" || !g.RetryAt.IsZero() {
				t.Fatalf("Take at %v: all granted, got reason %q retry_at %v, want none", now.Sub(t0), g.Reason, g.RetryAt)
			}
		case g.Reason == "burst":
			if want := sliceStart(p, cur+1); !g.RetryAt.Equal(want) {
				t.Fatalf("Take at %v: burst retry_at got %v, want the next slice %v", now.Sub(t0), g.RetryAt, want)
			}
		case g.Reason == "rpm" || g.Reason == "tpm":
			if !g.RetryAt.After(now) {
				t.Fatalf("Take at %v: %s retry_at got %v, want after now", now.Sub(t0), g.Reason, g.RetryAt)
			}
		default:
			t.Fatalf("Take at %v: got N=%d of %d with reason %q", now.Sub(t0), g.N, len(batch), g.Reason)
		}
		latest := sliceStart(p, cur+1).Add(p.DispatchGrace) // what the executor allows
		for _, c := range batch[:g.N] {
			at := now
			switch rng.IntN(6) {
			case 0:
			case 1:
				at = latest
			default:
				at = now.Add(time.Duration(rng.Int64N(int64(latest.Sub(now)) + 1)))
			}
			res.dispatched = append(res.dispatched, event{at, int64(c.Requests), int64(c.Tokens)})
			res.granted = append(res.granted, event{now, int64(c.Requests), int64(c.Tokens)})
		}
		queues[i] = queues[i][g.N:]
	}
	res.end = clock.Now()
	_, res.conflicts = kv.stats()
	return res
}

// maxTrailing returns the largest requests and tokens in any trailing window
// (T-width, T] of the events, and where each was seen.
func maxTrailing(events []event, width time.Duration) (maxR, maxT int64, atR, atT time.Time) {
	ev := slices.Clone(events)
	slices.SortFunc(ev, func(a, b event) int { return a.at.Compare(b.at) })
	var r, tok int64
	left := 0
	for _, e := range ev {
		r += e.requests
		tok += e.tokens
		for !ev[left].at.After(e.at.Add(-width)) {
			r -= ev[left].requests
			tok -= ev[left].tokens
			left++
		}
		if r > maxR {
			maxR, atR = r, e.at
		}
		if tok > maxT {
			maxT, atT = tok, e.at
		}
	}
	return maxR, maxT, atR, atT
}

// fill is the granted rate per 60 s as a fraction of the limit, measured
// over whole periods of Span slices after the first minute. (Under a
// backlog the grants repeat with that period, so a measurement over whole
// periods has no edge effect.)
func fill(p budget.Params, granted []event, end time.Time, limit int, pick func(event) int64) (float64, time.Duration) {
	period := time.Duration(p.Span()) * p.Slice
	from := t0.Add(period) // the first period boundary after the first minute
	n := end.Sub(from) / period
	to := from.Add(n * period)
	var sum int64
	for _, e := range granted {
		if !e.at.Before(from) && e.at.Before(to) {
			sum += pick(e)
		}
	}
	d := to.Sub(from)
	return float64(sum) / (float64(limit) * d.Minutes()), d
}

// The provider must never see more than the limits in any trailing 60 s,
// whatever the processes, batches, costs and dispatch delays; and under a
// backlog the grants must use the budget.
func TestNeverOverTheLimit(t *testing.T) {
	t.Parallel()
	p := defaultParams
	ops := 20_000 // for the main scenario; the others run half as long
	if testing.Short() {
		ops /= 4
	}
	for _, sc := range []scenario{
		{name: "tpm-bound", lim: budget.Limits{RPM: 1000, TPM: 100_000}, minTok: 100, maxTok: 4000, procs: 4, ops: ops, maxStep: 40 * time.Millisecond, seed: 1},
		{name: "rpm-bound", lim: budget.Limits{RPM: 240, TPM: 1_000_000}, minTok: 1, maxTok: 400, procs: 5, ops: ops / 2, maxStep: 40 * time.Millisecond, seed: 2},
		{name: "both bind", lim: budget.Limits{RPM: 60, TPM: 60_000}, minTok: 10, maxTok: 2000, procs: 3, ops: ops / 2, maxStep: 30 * time.Millisecond, seed: 3},
	} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			res := simulate(t, p, sc)
			maxR, maxT, atR, atT := maxTrailing(res.dispatched, time.Minute)
			t.Logf("%d requests granted over %v simulated (%d lost compare-and-sets); busiest trailing 60 s at the provider: %d of %d requests (at %v), %d of %d tokens (at %v)",
				len(res.granted), res.end.Sub(t0).Round(time.Second), res.conflicts, maxR, sc.lim.RPM, atR.Sub(t0), maxT, sc.lim.TPM, atT.Sub(t0))
			if maxR > int64(sc.lim.RPM) {
				t.Errorf("requests in a trailing 60 s ending %v: got %d, want at most %d", atR.Sub(t0), maxR, sc.lim.RPM)
			}
			if maxT > int64(sc.lim.TPM) {
				t.Errorf("tokens in a trailing 60 s ending %v: got %d, want at most %d", atT.Sub(t0), maxT, sc.lim.TPM)
			}
			// The check has teeth only if the load reached the limit.
			if float64(maxR) < 0.95*float64(sc.lim.RPM) && float64(maxT) < 0.95*float64(sc.lim.TPM) {
				t.Errorf("busiest trailing 60 s: got %d requests and %d tokens, want one within 5 %% of its limit (is the load backlogged?)", maxR, maxT)
			}
			fr, d := fill(p, res.granted, res.end, sc.lim.RPM, func(e event) int64 { return e.requests })
			ft, _ := fill(p, res.granted, res.end, sc.lim.TPM, func(e event) int64 { return e.tokens })
			ideal := 60 / (float64(p.Span()) * p.Slice.Seconds())
			t.Logf("steady-state fill over %v after the first minute: %.1f %% of RPM, %.1f %% of TPM (the window's ceiling is %.1f %%)", d, 100*fr, 100*ft, 100*ideal)
			if sc.name == "tpm-bound" && ft < 0.95 {
				t.Errorf("steady-state TPM fill: got %.1f %%, want at least 95 %%", 100*ft)
			}
			if sc.name == "rpm-bound" && fr < 0.95 {
				t.Errorf("steady-state RPM fill: got %.1f %%, want at least 95 %%", 100*fr)
			}
		})
	}
	// The checker catches a store whose window is too short for the delays
	// the executors allow.
	t.Run("checker catches a short window", func(t *testing.T) {
		t.Parallel()
		none := time.Duration(0)
		// 4000 operations in either tier: the shorter runs never reach the limit.
		res := simulate(t, p, scenario{lim: budget.Limits{RPM: 1000, TPM: 100_000}, minTok: 100, maxTok: 4000, procs: 2, ops: 4000, maxStep: 40 * time.Millisecond, seed: 4, storeGrace: &none})
		_, maxT, _, _ := maxTrailing(res.dispatched, time.Minute)
		if maxT <= 100_000 {
			t.Errorf("stores told no dispatch grace: got at most %d tokens in a trailing 60 s, want the checker to see more than 100000", maxT)
		}
	})
}

// RetryAt is exact for the minute limits: a lone process refused at RetryAt
// minus a nanosecond, granted at RetryAt.
func TestRetryAtIsTight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := noBurst
	lim := budget.Limits{RPM: 40, TPM: 30_000}
	rng := rand.New(rand.NewPCG(5, 0x5eed))
	kv := newFakeKV()
	clock := fakeclock.New(t0)
	st := budget.NewStore(kv, p, clock.Now)
	probes := 0
	ops := 3000
	if testing.Short() {
		ops = 1000
	}
	for range ops {
		now := clock.Advance(time.Duration(rng.Int64N(int64(400*time.Millisecond) + 1)))
		batch := make([]budget.Cost, 1+rng.IntN(5))
		for i := range batch {
			batch[i] = budget.Cost{Requests: 1 + rng.IntN(2), Tokens: 50 + rng.IntN(3000)}
		}
		g, err := st.Take(ctx, key, lim, batch)
		if err != nil {
			t.Fatalf("Take: %v", err)
		}
		if g.N == len(batch) {
			continue
		}
		if g.Reason != "rpm" && g.Reason != "tpm" {
			t.Fatalf("Take at %v: got reason %q, want rpm or tpm (no burst cap here)", now.Sub(t0), g.Reason)
		}
		head := batch[g.N : g.N+1]
		for _, tc := range []struct {
			at    time.Time
			wantN int
		}{{g.RetryAt.Add(-time.Nanosecond), 0}, {g.RetryAt, 1}} {
			pc := fakeclock.New(tc.at)
			probe := budget.NewStore(kv.clone(), p, pc.Now)
			pg, err := probe.Take(ctx, key, lim, head)
			if err != nil {
				t.Fatalf("probe Take: %v", err)
			}
			if pg.N != tc.wantN {
				t.Fatalf("refused at %v for %s with retry_at %v; a lone retry of %+v at %v: got N=%d (%q), want %d",
					now.Sub(t0), g.Reason, g.RetryAt.Sub(t0), head[0], tc.at.Sub(t0), pg.N, pg.Reason, tc.wantN)
			}
		}
		probes++
	}
	if probes < 100 {
		t.Errorf("probes: got %d refusals, want at least 100 for the test to mean something", probes)
	}
	t.Logf("%d refusals probed", probes)
}

// Processes racing on one bucket never grant more than the limit, whatever
// the interleaving of their compare-and-sets.
func TestConcurrentTake(t *testing.T) {
	t.Parallel()

	t.Run("one slice", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		const procs = 8
		lim := budget.Limits{RPM: 200, TPM: 0}
		kv := newFakeKV()
		clock := fakeclock.New(t0.Add(100 * time.Millisecond))
		// Hold the first write of every process until all have read and are
		// about to write: they all read the same (empty) state, so all but
		// one lose their first compare-and-set.
		var mu sync.Mutex
		arrived := 0
		release := make(chan struct{})
		kv.beforeUpdate = func(string) {
			mu.Lock()
			arrived++
			n := arrived
			mu.Unlock()
			if n == procs {
				close(release)
			}
			if n <= procs {
				<-release
			}
			// Yield between read and write so the processes keep racing.
			runtime.Gosched()
		}
		var wg sync.WaitGroup
		granted := make([]int, procs)
		errs := make([]error, procs)
		for i := range procs {
			st := budget.NewStore(kv, noBurst, clock.Now)
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			wg.Go(func() {
				for {
					batch := costs(1+rng.IntN(4), budget.Cost{Requests: 1, Tokens: 1 + rng.IntN(100)})
					g, err := st.Take(ctx, key, lim, batch)
					if err != nil {
						errs[i] = err
						return
					}
					for _, c := range batch[:g.N] {
						granted[i] += c.Requests
					}
					if g.N == 0 {
						return
					}
				}
			})
		}
		wg.Wait()
		total, gaveUp := 0, 0
		for i := range procs {
			switch {
			case errors.Is(errs[i], budget.ErrUnavailable):
				// A process starved of compare-and-sets gives up, failing
				// closed; the others go on.
				gaveUp++
			case errs[i] != nil:
				t.Errorf("process %d: %v", i, errs[i])
			}
			total += granted[i]
		}
		if gaveUp == procs {
			t.Errorf("processes that gave up: got all %d, want at least one to drain the budget", procs)
		}
		if total != lim.RPM {
			t.Errorf("requests granted in one window: got %d, want exactly %d (%v)", total, lim.RPM, granted)
		}
		writes, conflicts := kv.stats()
		if conflicts < procs-1 {
			t.Errorf("lost compare-and-sets: got %d, want at least %d", conflicts, procs-1)
		}
		t.Logf("%d writes, %d lost compare-and-sets, grants per process %v, %d gave up", writes, conflicts, granted, gaveUp)
	})

	t.Run("moving clock", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		const procs = 6
		p := budget.Params{Slice: time.Second, DispatchGrace: time.Second, BurstFraction: 0.2}
		lim := budget.Limits{RPM: 50, TPM: 20_000}
		kv := newFakeKV()
		clock := fakeclock.New(t0)
		type grant struct {
			slice    int64
			requests int
			tokens   int
		}
		grants := make([][]grant, procs)
		errs := make([]error, procs)
		var wg sync.WaitGroup
		for i := range procs {
			st := budget.NewStore(kv, p, clock.Now)
			rng := rand.New(rand.NewPCG(uint64(i), 8))
			wg.Go(func() {
				for range 400 {
					clock.Advance(time.Duration(rng.Int64N(int64(100 * time.Millisecond))))
					batch := make([]budget.Cost, 1+rng.IntN(4))
					for j := range batch {
						batch[j] = budget.Cost{Requests: 1, Tokens: 1 + rng.IntN(1500)}
					}
					g, err := st.Take(ctx, key, lim, batch)
					if err != nil {
						errs[i] = err
						return
					}
					for _, c := range batch[:g.N] {
						grants[i] = append(grants[i], grant{g.Slice, c.Requests, c.Tokens})
					}
				}
			})
		}
		wg.Wait()
		perSlice := map[int64][2]int{}
		lo, hi := int64(1<<62), int64(0)
		for i := range procs {
			if errs[i] != nil {
				t.Fatalf("process %d: %v", i, errs[i])
			}
			for _, g := range grants[i] {
				v := perSlice[g.slice]
				v[0] += g.requests
				v[1] += g.tokens
				perSlice[g.slice] = v
				lo, hi = min(lo, g.slice), max(hi, g.slice)
			}
		}
		// Every run of Span consecutive slices holds at most the limit.
		span := p.Span()
		var r, tok, maxR, maxT int
		for k := lo; k <= hi; k++ {
			r += perSlice[k][0]
			tok += perSlice[k][1]
			if old := k - span; old >= lo {
				r -= perSlice[old][0]
				tok -= perSlice[old][1]
			}
			maxR, maxT = max(maxR, r), max(maxT, tok)
		}
		if maxR > lim.RPM || maxT > lim.TPM {
			t.Errorf("busiest %d slices: got %d requests and %d tokens, want at most %d and %d", span, maxR, maxT, lim.RPM, lim.TPM)
		}
		_, conflicts := kv.stats()
		t.Logf("%d slices simulated, %d lost compare-and-sets, busiest window %d requests %d tokens", hi-lo+1, conflicts, maxR, maxT)
	})
}
