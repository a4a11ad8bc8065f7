package admission

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/pkg/job"
)

func newSched(weights map[string]int, floors map[job.Priority]float64) *Scheduler {
	return NewScheduler(1000, func(t string) int { return max(weights[t], 1) }, floors, time.Minute)
}

func fill(s *Scheduler, tenant string, p job.Priority, n, cost int) {
	for range n {
		s.Push(&Item{Tenant: tenant, Priority: p, Cost: cost, Size: 100})
	}
}

// drain pops n jobs a second apart and returns tokens served per tenant and per class.
func drain(s *Scheduler, n int) (byTenant map[string]int, byClass map[job.Priority]int, order []*Item) {
	byTenant, byClass = map[string]int{}, map[job.Priority]int{}
	now := time.Unix(1_000_000, 0)
	for range n {
		it := s.Pop(now)
		if it == nil {
			break
		}
		byTenant[it.Tenant] += it.Cost
		byClass[it.Priority] += it.Cost
		order = append(order, it)
		now = now.Add(100 * time.Millisecond)
	}
	return byTenant, byClass, order
}

func jain(xs ...float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	return sum * sum / (float64(len(xs)) * sq)
}

func TestFairShareByTokensAndWeight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		weights      map[string]int
		costA, costB int
		wantShareA   float64
	}{
		{"equal weights, equal sizes", nil, 500, 500, 0.5},
		{"equal weights, big vs small requests", nil, 5000, 200, 0.5},
		{"weights 2:1", map[string]int{"a": 2, "b": 1}, 500, 500, 2.0 / 3},
		{"weights 1:3, mixed sizes", map[string]int{"a": 1, "b": 3}, 3000, 700, 0.25},
	} {
		s := newSched(tc.weights, nil)
		fill(s, "a", job.Batch, 2000, tc.costA)
		fill(s, "b", job.Batch, 2000, tc.costB)
		// Serve about 400,000 tokens while both stay backlogged.
		n := 400_000 / ((tc.costA + tc.costB) / 2)
		by, _, _ := drain(s, n)
		share := float64(by["a"]) / float64(by["a"]+by["b"])
		if math.Abs(share-tc.wantShareA) > 0.05*tc.wantShareA {
			t.Errorf("%s: tenant a got %.3f of the tokens, want %.3f ± 5 %%", tc.name, share, tc.wantShareA)
		}
		wa, wb := float64(max(tc.weights["a"], 1)), float64(max(tc.weights["b"], 1))
		if j := jain(float64(by["a"])/wa, float64(by["b"])/wb); j < 0.99 {
			t.Errorf("%s: Jain's index of weighted shares %.3f, want >= 0.99", tc.name, j)
		}
	}
}

func TestLargeRequestsAreNotStarved(t *testing.T) {
	t.Parallel()
	s := newSched(nil, nil)
	fill(s, "small", job.Standard, 5000, 200)
	s.Push(&Item{Tenant: "big", Priority: job.Standard, Cost: 5000, Size: 1})
	_, _, order := drain(s, 100)
	for i, it := range order {
		if it.Tenant == "big" {
			// The big job waits while its tenant's deficit grows: at most
			// cost/quantum rounds, each serving about a quantum of small jobs.
			if i > 5000/1000*(1000/200+1)+1 {
				t.Errorf("the 5,000-token job came out at position %d; want within about %d", i, 5000/1000*(1000/200+1))
			}
			return
		}
	}
	t.Fatal("the 5,000-token job never came out within 100 pops")
}

// Within a tenant, interactive goes first and standard and batch keep their
// floors of that tenant's tokens.
func TestPriorityWithFloors(t *testing.T) {
	t.Parallel()
	floors := map[job.Priority]float64{job.Standard: 0.1, job.Batch: 0.05}
	s := newSched(nil, floors)
	fill(s, "x", job.Interactive, 3000, 500)
	fill(s, "x", job.Batch, 3000, 500)
	fill(s, "x", job.Standard, 3000, 500)
	_, byClass, order := drain(s, 2000)
	if order[0].Priority != job.Interactive {
		t.Errorf("first job served is %s, want interactive", order[0].Priority)
	}
	total := float64(byClass[job.Interactive] + byClass[job.Standard] + byClass[job.Batch])
	for p, f := range floors {
		if got := float64(byClass[p]) / total; got < f*0.95 {
			t.Errorf("%s got %.3f of the tokens, below its floor %.2f", p, got, f)
		}
	}
	if got := float64(byClass[job.Interactive]) / total; got < 0.8 {
		t.Errorf("interactive got %.3f; with floors of 15 %% it should get the rest", got)
	}
	// Without competition, a lower class gets everything.
	s2 := newSched(nil, floors)
	fill(s2, "y", job.Batch, 10, 500)
	if _, byClass, _ := drain(s2, 10); byClass[job.Batch] != 5000 {
		t.Errorf("batch alone got %d tokens, want all 5000", byClass[job.Batch])
	}
}

// Priority is declared by the tenant, so it orders only that tenant's work:
// a tenant marking everything interactive does not push another tenant's
// standard or batch work down to the floors. While both are backlogged each
// gets its weighted share, and the flooding tenant's interactive jobs do
// not come out ahead of the other's.
func TestSelfDeclaredPriorityKeepsFairShare(t *testing.T) {
	t.Parallel()
	floors := map[job.Priority]float64{job.Standard: 0.1, job.Batch: 0.05}
	for _, tc := range []struct {
		name    string
		weights map[string]int
		class   job.Priority
		want    float64 // the honest tenant's share
	}{
		{"standard, equal weights", nil, job.Standard, 0.5},
		{"batch, equal weights", nil, job.Batch, 0.5},
		{"standard, weights 1:2", map[string]int{"loud": 1, "quiet": 2}, job.Standard, 2.0 / 3},
	} {
		s := newSched(tc.weights, floors)
		fill(s, "loud", job.Interactive, 2000, 500)
		fill(s, "quiet", tc.class, 2000, 500)
		by, _, order := drain(s, 1000)
		share := float64(by["quiet"]) / float64(by["quiet"]+by["loud"])
		if share < tc.want-0.01 {
			t.Errorf("%s: the honest tenant got %.3f of the tokens, want its fair share %.3f", tc.name, share, tc.want)
		}
		// In order, not only in total: of the first 10 jobs, the honest
		// tenant's share is its share too.
		quiet := 0
		for _, it := range order[:10] {
			if it.Tenant == "quiet" {
				quiet++
			}
		}
		if float64(quiet) < tc.want*10-1 {
			t.Errorf("%s: %d of the first 10 jobs were the honest tenant's, want about %.0f", tc.name, quiet, tc.want*10)
		}
	}
}

func TestUnpopKeepsOrderAndDeficit(t *testing.T) {
	t.Parallel()
	s := newSched(nil, nil)
	fill(s, "a", job.Standard, 3, 400)
	fill(s, "b", job.Standard, 3, 400)
	now := time.Unix(0, 0)
	first := s.Pop(now)
	s.Unpop(first)
	again := s.Pop(now)
	if again != first {
		t.Fatalf("after Unpop the next job is %+v, want the same one back", again)
	}
	if n, _ := s.Len(); n != 5 {
		t.Errorf("Len = %d, want 5", n)
	}
}

// TestChargeGovernsTurns: the deficit pays an item's Charge (its share of
// the binding dimension), not its tokens, also when a refused job is put
// back; Tokens still counts the tokens the waiting jobs would reserve.
func TestChargeGovernsTurns(t *testing.T) {
	t.Parallel()
	s := newSched(nil, nil) // quantum 1000
	for range 10 {
		s.Push(&Item{Tenant: "a", Priority: job.Batch, Cost: 20, Charge: 1000})
		s.Push(&Item{Tenant: "b", Priority: job.Batch, Cost: 900, Charge: 1000})
	}
	if got := s.Tokens(); got != 10*20+10*900 {
		t.Fatalf("Tokens = %d, want %d", got, 10*20+10*900)
	}
	now := time.Unix(0, 0)
	var order string
	for range 10 {
		it := s.Pop(now)
		s.Unpop(it) // refused once: its charge goes back, it stays next
		if again := s.Pop(now); again != it {
			t.Fatalf("after Unpop got %+v, want %+v", again, it)
		}
		order += it.Tenant
	}
	if order != "ababababab" {
		t.Errorf("order %s, want one job a turn each: ababababab", order)
	}
}

func TestEvictTailAndRemove(t *testing.T) {
	t.Parallel()
	s := newSched(nil, nil)
	fill(s, "flood", job.Batch, 5, 100)
	fill(s, "one", job.Batch, 1, 100)
	fill(s, "vip", job.Interactive, 1, 100)
	it := s.EvictTail()
	if it == nil || it.Tenant != "flood" || it.Priority != job.Batch {
		t.Fatalf("evicted %+v, want the flooding tenant's newest batch job", it)
	}
	gone := s.Remove(func(it *Item) bool { return it.Tenant == "one" })
	if len(gone) != 1 {
		t.Errorf("Remove returned %d items, want 1", len(gone))
	}
	if n, bytes := s.Len(); n != 5 || bytes != 500 {
		t.Errorf("Len = %d jobs, %d bytes; want 5 and 500", n, bytes)
	}
	_, _, order := drain(s, 10)
	// Both are new flows, served in arrival order: the flood's four (one
	// quantum's worth), then vip's.
	if len(order) != 5 || order[4].Tenant != "vip" {
		t.Errorf("after eviction and removal: %d jobs, last %q; want 5 with vip's last", len(order), order[len(order)-1].Tenant)
	}
}

// TestNewFlowGoesFirst: a tenant's job arriving while a neighbour's backlog
// waits is served next, within one quantum; a tenant that floods gets no
// more than its fair share for having arrived as a new flow.
func TestNewFlowGoesFirst(t *testing.T) {
	t.Parallel()
	s := newSched(nil, nil)
	fill(s, "a", job.Batch, 2000, 300)
	drain(s, 50)
	if !s.Waiting("a", job.Batch) || s.Waiting("a", job.Interactive) || s.Waiting("b", job.Batch) {
		t.Errorf("Waiting: a batch %v, a interactive %v, b batch %v; want true, false, false",
			s.Waiting("a", job.Batch), s.Waiting("a", job.Interactive), s.Waiting("b", job.Batch))
	}
	if !s.IsNew("b") || s.IsNew("a") {
		t.Fatalf("IsNew: b %v, a %v; want true, false", s.IsNew("b"), s.IsNew("a"))
	}
	now := time.Unix(2_000_000, 0)
	for i := range 20 {
		s.Push(&Item{Tenant: "b", Priority: job.Batch, Cost: 300, Size: 1})
		it := s.Pop(now)
		if it.Tenant != "b" || !it.Fresh {
			t.Fatalf("arrival %d: next served is %s (fresh %v), want b's new job", i, it.Tenant, it.Fresh)
		}
		// A refused reservation puts it back; it is still next.
		s.Unpop(it)
		if again := s.Pop(now); again != it || !again.Fresh {
			t.Fatalf("arrival %d: after Unpop got %+v, want b's job again, fresh", i, again)
		}
		// a's backlog keeps moving between b's arrivals.
		if it := s.Pop(now); it.Tenant != "a" {
			t.Fatalf("arrival %d: then %s, want a", i, it.Tenant)
		}
	}

	// A flood that starts as a new flow gets one quantum ahead, then shares.
	s = newSched(nil, nil)
	fill(s, "a", job.Batch, 2000, 300)
	drain(s, 10)
	fill(s, "b", job.Batch, 2000, 300)
	by, _, order := drain(s, 1000)
	fresh := 0
	for _, it := range order {
		if it.Fresh {
			fresh++
		}
	}
	if fresh > 1000/300+1 {
		t.Errorf("%d of b's jobs were served as a new flow; want at most one quantum's worth (%d)", fresh, 1000/300+1)
	}
	if share := float64(by["b"]) / float64(by["a"]+by["b"]); math.Abs(share-0.5) > 0.01 {
		t.Errorf("b got %.3f of the tokens while both were backlogged, want 0.5 ± 0.01", share)
	}
}

// TestDemandChunks: predicted demand is asked in pieces of whole average
// jobs, so what a partly full window grants fits jobs.
func TestDemandChunks(t *testing.T) {
	t.Parallel()
	units := func(u ...int) (out [budget.MaxUnits]int) {
		copy(out[:], u)
		return out
	}
	for _, tc := range []struct {
		d    budget.Cost
		want []budget.Cost
	}{
		{budget.Cost{Requests: 0, Tokens: 500}, nil},
		{budget.Cost{Requests: 3, Tokens: 0}, nil},
		{budget.Cost{Requests: 1, Tokens: 90}, []budget.Cost{{Requests: 1, Tokens: 90}}},
		{budget.Cost{Requests: 2, Tokens: 60}, []budget.Cost{{Requests: 1, Tokens: 30}, {Requests: 1, Tokens: 30}}},
		{budget.Cost{Requests: 10, Tokens: 1000}, []budget.Cost{{Requests: 2, Tokens: 250}, {Requests: 2, Tokens: 250}, {Requests: 2, Tokens: 250}, {Requests: 2, Tokens: 250}}},
		// Units are rounded up, so every piece fits a job of one; a
		// negative unit (less demand than need) asks none.
		{budget.Cost{Requests: 8, Tokens: 800, Units: units(6, -2)}, []budget.Cost{
			{Requests: 2, Tokens: 200, Units: units(2)}, {Requests: 2, Tokens: 200, Units: units(2)},
			{Requests: 2, Tokens: 200, Units: units(2)}, {Requests: 2, Tokens: 200, Units: units(2)}}},
	} {
		if got := demandChunks(tc.d); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("demandChunks(%+v) = %v, want %v", tc.d, got, tc.want)
		}
	}
}
