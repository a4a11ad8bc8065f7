package budget_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
)

// unitSend is one call as the provider sees it, in every dimension.
type unitSend struct {
	at time.Time
	v  budget.Vec
}

// strictVecProvider is strictProvider for every dimension: a sliding 60-s
// window at each minute limit, and a sliding 1-s window at ceil(limit/60)
// in which a call larger than the cap is admitted only alone. It returns
// how many sends it would refuse and the most any 1-s and 60-s window held
// of dimension d.
func strictVecProvider(sends []unitSend, limits budget.Vec, d int) (refused int, most1, most60 int64) {
	sort.Slice(sends, func(i, j int) bool { return sends[i].at.Before(sends[j].at) })
	for i, s := range sends {
		var in1, in60 budget.Vec
		n1 := 0
		for _, p := range sends[:i] {
			gap := s.at.Sub(p.at)
			for k := range in1 {
				if gap < time.Second {
					in1[k] += p.v[k]
				}
				if gap < time.Minute {
					in60[k] += p.v[k]
				}
			}
			if gap < time.Second {
				n1++
			}
		}
		most1 = max(most1, in1[d]+s.v[d])
		most60 = max(most60, in60[d]+s.v[d])
		for k, limit := range limits {
			if limit <= 0 {
				continue
			}
			quantum := (limit + 59) / 60
			if in60[k]+s.v[k] > limit || (n1 > 0 && in1[k]+s.v[k] > quantum) {
				refused++
				break
			}
		}
	}
	return refused, most1, most60
}

// TestPacedThirdDimension plans jobs that cost requests, tokens and images
// from three processes against a model whose images bind (RPM and TPM are
// generous), sends each within the tolerance after its instant, and checks
// the provider sees at most the images' limit in every minute and second,
// refuses nothing, and the minute fills.
func TestPacedThirdDimension(t *testing.T) {
	if testing.Short() {
		t.Skip("long simulated schedules, about 5-7 s: the full tier runs it, not -short")
	}
	t.Parallel()
	for _, tc := range []struct {
		name    string
		lim     budget.Limits
		unit    int // the binding unit's index
		cost    func(*rand.Rand) budget.Cost
		minFill float64
	}{
		// 600 images a minute: a quantum of 10 a second; jobs of 1-2.
		{"images bind", budget.Limits{RPM: 100_000, TPM: 100_000_000, Units: [budget.MaxUnits]int{600}}, 0,
			func(r *rand.Rand) budget.Cost {
				return budget.Cost{Requests: 1, Tokens: 100, Units: [budget.MaxUnits]int{1 + r.IntN(2)}}
			}, 0.85},
		// Two units limited, the second binds (120 a minute: a quantum of
		// 2); jobs that cost none of it pass between.
		{"second of two units binds", budget.Limits{RPM: 100_000, TPM: 100_000_000, Units: [budget.MaxUnits]int{100_000, 120}}, 1,
			func(r *rand.Rand) budget.Cost {
				return budget.Cost{Requests: 1, Tokens: 50, Units: [budget.MaxUnits]int{3, r.IntN(3)}}
			}, 0.85},
		// A 30-second audio clip against 1,200 seconds a minute (a
		// quantum of 20): every job is larger than the quantum and gets
		// its second alone.
		{"costs above the quantum", budget.Limits{RPM: 100_000, TPM: 100_000_000, Units: [budget.MaxUnits]int{0, 0, 1200}}, 2,
			func(r *rand.Rand) budget.Cost {
				return budget.Cost{Requests: 1, Tokens: 10, Units: [budget.MaxUnits]int{0, 0, 21 + r.IntN(10)}}
			}, 0.85},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, pacedParams)
			rnd := rand.New(rand.NewPCG(3, 4))
			ctx := context.Background()
			var sends []unitSend
			reasons := map[string]int{}
			for range 3000 { // 150 s of 50-ms steps, always backlogged
				now := b.clock.Advance(50 * time.Millisecond)
				batch := make([]budget.Cost, 1+rnd.IntN(8))
				for i := range batch {
					batch[i] = tc.cost(rnd)
				}
				g, err := b.store.Take(ctx, key, tc.lim, batch)
				if err != nil {
					t.Fatal(err)
				}
				reasons[g.Reason]++
				for i := range g.N {
					if g.SendAt[i].Before(now) {
						t.Fatalf("send instant %v before now %v", g.SendAt[i], now)
					}
					late := time.Duration(rnd.Int64N(int64(pacedParams.Tolerance) + 1))
					sends = append(sends, unitSend{at: g.SendAt[i].Add(late), v: vecOf(batch[i])})
				}
			}
			d := 2 + tc.unit
			limit := int64(tc.lim.Units[tc.unit])
			var limits budget.Vec
			limits[0], limits[1] = int64(tc.lim.RPM), int64(tc.lim.TPM)
			for i, u := range tc.lim.Units {
				limits[2+i] = int64(u)
			}
			refused, most1, most60 := strictVecProvider(sends, limits, d)
			if refused > 0 {
				t.Errorf("the provider refused %d of %d sends", refused, len(sends))
			}
			if most60 > limit {
				t.Errorf("a minute held %d of the unit, limit %d", most60, limit)
			}
			quantum := (limit + 59) / 60
			var largest int64
			for _, s := range sends {
				largest = max(largest, s.v[d])
			}
			if most1 > max(quantum, largest) {
				t.Errorf("a second held %d of the unit, quantum %d (largest cost %d)", most1, quantum, largest)
			}
			var got int64
			for _, s := range sends {
				if gap := s.at.Sub(t0); gap >= time.Minute && gap < 2*time.Minute {
					got += s.v[d]
				}
			}
			if fill := float64(got) / float64(limit); fill < tc.minFill || fill > 1 {
				t.Errorf("fill of the second minute %.3f, want [%.2f, 1]", fill, tc.minFill)
			} else {
				t.Logf("fill %.3f; most in a second %d, in a minute %d; reasons %v", fill, most1, most60, reasons)
			}
		})
	}
}

func vecOf(c budget.Cost) budget.Vec {
	v := budget.Vec{int64(c.Requests), int64(c.Tokens)}
	for i, u := range c.Units {
		v[2+i] = int64(u)
	}
	return v
}

// TestUnitLimits checks the minute of a unit on its own: a cost larger
// than the unit's whole minute is refused with reason "units", a unit with
// no limit binds nothing, and a plain (unpaced) store counts units too.
func TestUnitLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	images := func(n int) budget.Cost { return budget.Cost{Requests: 1, Tokens: 1, Units: [budget.MaxUnits]int{n}} }

	b := setup(t, pacedParams)
	lim := budget.Limits{RPM: 1000, TPM: 1_000_000, Units: [budget.MaxUnits]int{50}}
	g, err := b.store.Take(ctx, key, lim, []budget.Cost{images(51)})
	if err != nil {
		t.Fatal(err)
	}
	if g.N != 0 || g.Reason != "units" {
		t.Errorf("51 images against 50 a minute: got N=%d reason %q, want 0 and \"units\"", g.N, g.Reason)
	}
	// No limit on the unit: the images do not count against anything.
	g, err = b.store.Take(ctx, key, budget.Limits{RPM: 1000, TPM: 1_000_000}, []budget.Cost{images(1_000_000)})
	if err != nil || g.N != 1 {
		t.Errorf("a unit without a limit: got N=%d err %v, want 1", g.N, err)
	}

	// A plain store (tenant windows): the minute of images binds.
	p := setup(t, noBurst)
	lim = budget.Limits{RPM: 1000, TPM: 1_000_000, Units: [budget.MaxUnits]int{0, 5}}
	two := budget.Cost{Requests: 1, Tokens: 1, Units: [budget.MaxUnits]int{7, 2}}
	g, err = p.store.Take(ctx, key, lim, costs(4, two))
	if err != nil {
		t.Fatal(err)
	}
	if g.N != 2 || g.Reason != "units" {
		t.Errorf("4 jobs of 2 against 5 a minute: got N=%d reason %q, want 2 and \"units\"", g.N, g.Reason)
	}
	used, err := p.store.Used(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if want := (budget.Cost{Requests: 2, Tokens: 2, Units: [budget.MaxUnits]int{14, 4}}); used != want {
		t.Errorf("used %+v, want %+v", used, want)
	}
	// What comes back frees the unit too.
	if err := p.store.Return(ctx, key, g.Slice, two); err != nil {
		t.Fatal(err)
	}
	g, err = p.store.Take(ctx, key, lim, costs(1, two))
	if err != nil || g.N != 1 {
		t.Errorf("after a return: got N=%d err %v, want 1", g.N, err)
	}
}

// TestPacedUnitSpacing: a unit's minute paces its sends like requests and
// tokens (60 images a minute: one a second), and ReturnAt gives the unit
// back.
func TestPacedUnitSpacing(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	lim := budget.Limits{RPM: 100_000, TPM: 100_000_000, Units: [budget.MaxUnits]int{0, 0, 0, 60}}
	one := budget.Cost{Requests: 1, Tokens: 10, Units: [budget.MaxUnits]int{0, 0, 0, 1}}
	g, err := b.store.Take(ctx, key, lim, costs(4, one))
	if err != nil {
		t.Fatal(err)
	}
	// 1 s apart, and the horizon (2 s) holds the first three.
	if g.N != 2 && g.N != 3 {
		t.Fatalf("granted %d of 4 within a 2-s horizon at one a second", g.N)
	}
	for i := 1; i < g.N; i++ {
		if d := g.SendAt[i].Sub(g.SendAt[i-1]); d < time.Second {
			t.Errorf("send %d only %v after the previous; 60 a minute paces every second", i, d)
		}
	}
	for i := range g.N {
		if err := b.store.ReturnAt(ctx, key, g.SendAt[i], one); err != nil {
			t.Fatal(err)
		}
	}
	used, err := b.store.Used(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if used != (budget.Cost{}) {
		t.Errorf("after the returns the window holds %+v, want nothing", used)
	}
}

// TestWindowFormatUnits: a window stored before units existed reads as
// one whose units are zero, and a window with units keeps requests and
// tokens where an older process reads them.
func TestWindowFormatUnits(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	k := sliceOf(pacedParams, b.clock.Now())
	at := b.clock.Now().Add(30 * time.Millisecond).UnixMicro()
	old := fmt.Sprintf(`{"s":{"%d":[3,300]},"p":[{"a":%d,"r":3,"t":300}],"tat":[%d,%d],"last":%d}`, k, at, at, at, at)
	b.kv.set(key, []byte(old))
	used, err := b.store.Used(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if want := (budget.Cost{Requests: 3, Tokens: 300}); used != want {
		t.Errorf("old window: used %+v, want %+v", used, want)
	}
	lim := budget.Limits{RPM: 100_000, TPM: 100_000_000, Units: [budget.MaxUnits]int{600}}
	g, err := b.store.Take(ctx, key, lim, []budget.Cost{{Requests: 1, Tokens: 10, Units: [budget.MaxUnits]int{2}}})
	if err != nil || g.N != 1 {
		t.Fatalf("take on an old window: N=%d err %v", g.N, err)
	}
	used, err = b.store.Used(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if want := (budget.Cost{Requests: 4, Tokens: 310, Units: [budget.MaxUnits]int{2}}); used != want {
		t.Errorf("after a take with units: used %+v, want %+v", used, want)
	}
	// An older process reads [requests, tokens] of every slice and the
	// placements' r and t.
	var older struct {
		S map[string][2]int64 `json:"s"`
		P []struct {
			A, R, T int64
		} `json:"p"`
	}
	raw := b.kv.value(key)
	if err := json.Unmarshal(raw, &older); err != nil {
		t.Fatalf("an older reader: %v (in %s)", err, raw)
	}
	var r, tk int64
	for _, v := range older.S {
		r += v[0]
		tk += v[1]
	}
	if r != 4 || tk != 310 {
		t.Errorf("an older reader sees %d requests and %d tokens, want 4 and 310 (in %s)", r, tk, raw)
	}
	if !strings.Contains(string(raw), `"u":[2]`) {
		t.Errorf("the placement's units are not stored as \"u\": %s", raw)
	}
}

// TestLeaseSpendsEveryDimension: a block is spent only by a cost within
// its room in every dimension, and a refund restores the units.
func TestLeaseSpendsEveryDimension(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	l := budget.NewLease(b.store, key)
	lim := budget.Limits{RPM: 100_000, TPM: 100_000_000, Units: [budget.MaxUnits]int{600}}
	room := budget.Cost{Requests: 2, Tokens: 200, Units: [budget.MaxUnits]int{2}}
	if _, err := l.Take(ctx, lim, nil, []budget.Cost{room}, false, 0); err != nil {
		t.Fatal(err)
	}
	now := b.clock.Now()
	big := budget.Cost{Requests: 1, Tokens: 10, Units: [budget.MaxUnits]int{3}}
	if _, ok := l.Spend(big, false, now, 0); ok {
		t.Errorf("a cost of 3 images spent a block with room for 2")
	}
	one := budget.Cost{Requests: 1, Tokens: 10, Units: [budget.MaxUnits]int{1}}
	blk, ok := l.Spend(one, false, now, 0)
	if !ok {
		t.Fatalf("a cost of 1 image found no room in a block of 2")
	}
	if want := (budget.Cost{Requests: 1, Tokens: 190, Units: [budget.MaxUnits]int{1}}); blk.Left != want {
		t.Errorf("left after spending: %+v, want %+v", blk.Left, want)
	}
	if _, ok := l.Spend(budget.Cost{Requests: 1, Units: [budget.MaxUnits]int{2}}, false, now, 0); ok {
		t.Errorf("2 images spent a block with 1 left")
	}
	l.Refund(ctx, blk, one, now)
	if _, ok := l.Spend(budget.Cost{Requests: 1, Units: [budget.MaxUnits]int{2}}, false, now, 0); !ok {
		t.Errorf("after a refund, 2 images found no room")
	}
}

// TestLeaseSpendAllocatesNothing: spending a block, the per-job hot path of
// admission, allocates nothing with units as without.
func TestLeaseSpendAllocatesNothing(t *testing.T) {
	b := setup(t, pacedParams)
	ctx := context.Background()
	l := budget.NewLease(b.store, key)
	lim := budget.Limits{RPM: 100_000, TPM: 100_000_000, Units: [budget.MaxUnits]int{600_000}}
	room := budget.Cost{Requests: 10_000, Tokens: 1_000_000, Units: [budget.MaxUnits]int{10_000}}
	if _, err := l.Take(ctx, lim, nil, []budget.Cost{room}, false, 0); err != nil {
		t.Fatal(err)
	}
	now := b.clock.Now()
	one := budget.Cost{Requests: 1, Tokens: 10, Units: [budget.MaxUnits]int{1}}
	if n := testing.AllocsPerRun(1000, func() {
		l.Count(one, false, now)
		if _, ok := l.Spend(one, false, now, 0); !ok {
			t.Fatal("no room")
		}
	}); n != 0 {
		t.Errorf("Count and Spend allocate %v times per job, want 0", n)
	}
}
