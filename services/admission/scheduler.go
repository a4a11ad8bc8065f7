package admission

import (
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Scheduler orders the jobs waiting for one model's budget. Tenants take
// turns first: deficit round robin over tenants, each job charged its share
// of the model's minute in the dimension that binds it (its Charge: tokens
// on a token-bound model, a request's worth at least on a request-bound
// one; fair.go) and weighted by the tenants' weights, so tenants share the
// binding budget in proportion to their weights whatever their request
// sizes and whatever priorities they declare, and a large request is never
// starved by a stream of small ones (its tenant's deficit grows each round
// until it fits). Priority orders the work within a tenant: its interactive
// jobs go first, but its standard and batch jobs each keep a floor: when a
// class with waiting jobs has had less than its floor share of what the
// tenant was charged in the trailing window, it goes next. A tenant that
// marks everything interactive thereby reorders only its own work.
//
// A tenant with nothing waiting that gets a job is a new flow (as in
// FQ-CoDel): it is served before the tenants already backlogged, for up to
// one quantum, so a tenant that sends a job now and then does not queue
// behind a neighbour's thousands. A new flow that outlasts its quantum
// joins the round robin's tail like any backlogged tenant, so the shares of
// backlogged tenants stay weighted-fair. Pure data structure: no I/O, no
// goroutines, clock injected.
type Scheduler struct {
	quantum int
	weight  func(tenant string) int
	floors  map[job.Priority]float64
	window  time.Duration
	tenants map[string]*tenantQueue
	fresh   []string // new flows, served first, each for up to one quantum
	ring    []string // backlogged tenants, in round-robin order
	cur     int
	topped  bool
	classN  map[job.Priority]int
	n       int
	bytes   int
	tokens  int
}

// tenantQueue is one tenant's waiting jobs by class, its deficit, and the
// charges it was served per class in the trailing window (for the floors).
type tenantQueue struct {
	classes  map[job.Priority][]*Item
	n        int
	deficit  int
	served   []servedAt
	total    int
	perClass map[job.Priority]int
}

type servedAt struct {
	at     time.Time
	class  job.Priority
	charge int
}

// Item is one waiting job.
type Item struct {
	Tenant   string
	Priority job.Priority
	Cost     int // tokens reserved
	// Charge is what the job costs its tenant's turn (fair.go); 0: Cost.
	Charge int
	Size   int // bytes held
	Since  time.Time
	Value  any
	// Fresh is set by Pop when the job was served as part of its tenant's
	// new-flow quantum (it did not wait its turn behind backlogs).
	Fresh bool
	// Urgent is set by the caller: the job may use the headroom (an
	// interactive job, or one that started a new flow while others waited).
	Urgent bool
}

// NewScheduler makes a scheduler. quantum is what a tenant of weight 1
// earns per round, in the unit of the items' charges; floors maps standard
// and batch to their minimum share of a tenant's charges.
func NewScheduler(quantum int, weight func(string) int, floors map[job.Priority]float64, window time.Duration) *Scheduler {
	return &Scheduler{quantum: quantum, weight: weight, floors: floors, window: window,
		tenants: map[string]*tenantQueue{}, classN: map[job.Priority]int{}}
}

// Len returns how many jobs wait and the bytes they hold.
func (s *Scheduler) Len() (n, bytes int) { return s.n, s.bytes }

// TenantLen returns how many of tenant t's jobs wait.
func (s *Scheduler) TenantLen(t string) int {
	if tq := s.tenants[t]; tq != nil {
		return tq.n
	}
	return 0
}

// Tokens returns the tokens the waiting jobs would reserve.
func (s *Scheduler) Tokens() int { return s.tokens }

// ClassLen returns how many jobs of class p wait.
func (s *Scheduler) ClassLen(p job.Priority) int { return s.classN[p] }

// charge is what it costs its tenant's turn.
func (it *Item) charge() int {
	if it.Charge > 0 {
		return it.Charge
	}
	return it.Cost
}

func (s *Scheduler) added(it *Item) {
	s.n++
	s.bytes += it.Size
	s.tokens += it.Cost
	s.classN[it.Priority]++
}

func (s *Scheduler) removed(it *Item) {
	s.n--
	s.bytes -= it.Size
	s.tokens -= it.Cost
	s.classN[it.Priority]--
}

// queue returns tenant t's queue, making an empty one.
func (s *Scheduler) queue(t string) *tenantQueue {
	tq := s.tenants[t]
	if tq == nil {
		tq = &tenantQueue{classes: map[job.Priority][]*Item{}, perClass: map[job.Priority]int{}}
		s.tenants[t] = tq
	}
	return tq
}

// Push adds a job at the tail of its tenant's queue for its class.
func (s *Scheduler) Push(it *Item) {
	tq := s.tenants[it.Tenant]
	if tq == nil {
		tq = s.queue(it.Tenant)
		s.fresh = append(s.fresh, it.Tenant)
		tq.deficit = s.quantum * max(s.weight(it.Tenant), 1)
	}
	tq.classes[it.Priority] = append(tq.classes[it.Priority], it)
	tq.n++
	s.added(it)
}

// PushFront adds a job at the head of its tenant's queue for its class,
// with the deficit it was charged when it was served before given back: a
// job the provider refused for rate (Sluice's misjudgement) keeps its place.
func (s *Scheduler) PushFront(it *Item) {
	tq := s.tenants[it.Tenant]
	if tq == nil {
		s.Push(it)
		return
	}
	tq.classes[it.Priority] = append([]*Item{it}, tq.classes[it.Priority]...)
	tq.n++
	tq.deficit += it.charge()
	s.added(it)
}

// IsNew reports whether a job pushed now for tenant would start a new flow
// while other tenants' jobs wait.
func (s *Scheduler) IsNew(tenant string) bool {
	return s.tenants[tenant] == nil && len(s.tenants) > 0
}

// Waiting reports whether tenant has jobs of class p waiting.
func (s *Scheduler) Waiting(tenant string, p job.Priority) bool {
	tq := s.tenants[tenant]
	return tq != nil && len(tq.classes[p]) > 0
}

// Unpop puts back a job Pop returned (its reservation failed): at the head
// of its tenant's queue, with the deficit it spent, its tenant next in turn.
func (s *Scheduler) Unpop(it *Item) {
	tq := s.tenants[it.Tenant]
	switch {
	case it.Fresh && tq == nil:
		s.fresh = append([]string{it.Tenant}, s.fresh...)
	case it.Fresh:
		// Still a new flow, at the head of the list.
	case tq == nil:
		// Back into the ring at the current position: it goes next.
		pos := min(s.cur, len(s.ring))
		s.ring = append(s.ring[:pos], append([]string{it.Tenant}, s.ring[pos:]...)...)
		s.cur = pos
		s.topped = true
	}
	it.Fresh = false
	tq = s.queue(it.Tenant)
	tq.classes[it.Priority] = append([]*Item{it}, tq.classes[it.Priority]...)
	tq.n++
	tq.deficit += it.charge()
	s.added(it)
	tq.unserve(it)
}

// Pop returns the next job in fair order, or nil when none waits.
func (s *Scheduler) Pop(now time.Time) *Item {
	if s.n == 0 {
		return nil
	}
	for len(s.fresh) > 0 {
		t := s.fresh[0]
		if it := s.serve(t, now); it != nil {
			it.Fresh = true
			return it
		}
		// Its quantum is spent: it waits its turn with the backlogged,
		// keeping what is left of its deficit.
		s.fresh = s.fresh[1:]
		s.ring = append(s.ring, t)
	}
	for {
		s.cur %= len(s.ring)
		t := s.ring[s.cur]
		if !s.topped {
			s.tenants[t].deficit += s.quantum * max(s.weight(t), 1)
			s.topped = true
		}
		if it := s.serve(t, now); it != nil {
			return it
		}
		s.cur++
		s.topped = false
	}
}

// serve takes tenant t's next job, in its own priority order, if its
// deficit covers the job's cost.
func (s *Scheduler) serve(t string, now time.Time) *Item {
	tq := s.tenants[t]
	c := tq.nextClass(now, s.window, s.floors)
	cq := tq.classes[c]
	if tq.deficit < cq[0].charge() {
		return nil
	}
	it := cq[0]
	ch := it.charge()
	tq.deficit -= ch
	if len(cq) == 1 {
		delete(tq.classes, c)
	} else {
		tq.classes[c] = cq[1:]
	}
	tq.n--
	s.removed(it)
	tq.served = append(tq.served, servedAt{at: now, class: c, charge: ch})
	tq.total += ch
	tq.perClass[c] += ch
	if tq.n == 0 {
		s.drop(t)
	}
	return it
}

// nextClass picks the tenant's class to serve: a waiting class below its
// floor (the one furthest below), else the highest priority waiting.
func (tq *tenantQueue) nextClass(now time.Time, window time.Duration, floors map[job.Priority]float64) job.Priority {
	from := now.Add(-window)
	k := 0
	for k < len(tq.served) && tq.served[k].at.Before(from) {
		tq.total -= tq.served[k].charge
		tq.perClass[tq.served[k].class] -= tq.served[k].charge
		k++
	}
	tq.served = tq.served[k:] // the backing array is reused by append, amortized
	best, worst := job.Priority(""), 0.0
	if tq.total > 0 {
		for _, p := range job.Priorities {
			f := floors[p]
			if f <= 0 || len(tq.classes[p]) == 0 {
				continue
			}
			if short := f - float64(tq.perClass[p])/float64(tq.total); short > worst {
				best, worst = p, short
			}
		}
	}
	if best != "" {
		return best
	}
	for _, p := range job.Priorities {
		if len(tq.classes[p]) > 0 {
			return p
		}
	}
	return "" // unreachable: a tenant in the scheduler has a job waiting
}

func (tq *tenantQueue) unserve(it *Item) {
	for i := len(tq.served) - 1; i >= 0; i-- {
		if ch := it.charge(); tq.served[i].class == it.Priority && tq.served[i].charge == ch {
			tq.served = append(tq.served[:i], tq.served[i+1:]...)
			tq.total -= ch
			tq.perClass[it.Priority] -= ch
			return
		}
	}
}

// Each visits every waiting job (for visibility and eviction), in no
// particular order; fn returns false to stop.
func (s *Scheduler) Each(fn func(*Item) bool) {
	for _, tq := range s.tenants {
		for _, cq := range tq.classes {
			for _, it := range cq {
				if !fn(it) {
					return
				}
			}
		}
	}
}

// EvictTail removes and returns the newest job of the tenant holding the
// most jobs in the lowest-priority class that has any (to bound memory:
// that job goes back to JetStream to wait there).
func (s *Scheduler) EvictTail() *Item {
	for i := len(job.Priorities) - 1; i >= 0; i-- {
		p := job.Priorities[i]
		most, who := 0, ""
		for t, tq := range s.tenants {
			if n := len(tq.classes[p]); n > most {
				most, who = n, t
			}
		}
		if who == "" {
			continue
		}
		tq := s.tenants[who]
		cq := tq.classes[p]
		it := cq[len(cq)-1]
		if len(cq) == 1 {
			delete(tq.classes, p)
		} else {
			tq.classes[p] = cq[:len(cq)-1]
		}
		tq.n--
		s.removed(it)
		if tq.n == 0 {
			s.drop(who)
		}
		return it
	}
	return nil
}

// Remove drops items for which drop returns true (expired jobs); it returns them.
func (s *Scheduler) Remove(drop func(*Item) bool) []*Item {
	var out []*Item
	for t, tq := range s.tenants {
		for p, cq := range tq.classes {
			keep := cq[:0]
			for _, it := range cq {
				if drop(it) {
					out = append(out, it)
					tq.n--
					s.removed(it)
				} else {
					keep = append(keep, it)
				}
			}
			if len(keep) == 0 {
				delete(tq.classes, p)
			} else {
				tq.classes[p] = keep
			}
		}
		if tq.n == 0 {
			s.drop(t)
		}
	}
	return out
}

// drop removes an emptied tenant: its queue, its deficit (an idle tenant
// banks no credit) and its place in the ring. The tenant whose turn it is
// keeps its turn unless it is the one dropped.
func (s *Scheduler) drop(t string) {
	delete(s.tenants, t)
	for k, x := range s.fresh {
		if x == t {
			s.fresh = append(s.fresh[:k], s.fresh[k+1:]...)
			return
		}
	}
	for k, x := range s.ring {
		if x != t {
			continue
		}
		s.ring = append(s.ring[:k], s.ring[k+1:]...)
		switch {
		case k < s.cur:
			s.cur--
		case k == s.cur:
			s.topped = false
		}
		break
	}
	if len(s.ring) > 0 {
		s.cur %= len(s.ring)
	} else {
		s.cur = 0
	}
}

// Share returns tenant t's weighted share of the turns among the tenants
// with jobs waiting (1 when it waits alone) and whether others wait.
func (s *Scheduler) Share(t string) (share float64, others bool) {
	total := 0
	for name, tq := range s.tenants {
		if tq.n > 0 {
			total += max(s.weight(name), 1)
			others = others || name != t
		}
	}
	if total == 0 {
		return 1, false
	}
	return float64(max(s.weight(t), 1)) / float64(total), others
}

// PositionOf returns how many of tenant t's waiting jobs go before the one
// v holds, plus one (its place in its tenant's queue, classes in priority
// order; the floors may reorder them), or 0 when it is not waiting.
func (s *Scheduler) PositionOf(t string, v any) int {
	tq := s.tenants[t]
	if tq == nil {
		return 0
	}
	n := 0
	for _, p := range job.Priorities {
		for _, it := range tq.classes[p] {
			n++
			if it.Value == v {
				return n
			}
		}
	}
	return 0
}
