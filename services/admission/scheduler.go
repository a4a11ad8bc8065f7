package admission

import (
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Scheduler orders the jobs waiting for one model's budget. Within a
// priority class it is deficit round robin over tenants, charged by the
// tokens each job reserves and weighted by the tenants' weights, so tenants
// share the budget in proportion to their weights whatever their request
// sizes, and a large request is never starved by a stream of small ones: its
// tenant's deficit grows each round until it fits. Across classes,
// interactive goes first, but standard and batch each keep a floor: when a
// class with waiting jobs has had less than its floor share of the tokens
// dispatched in the trailing window, it goes next.
//
// A tenant with nothing waiting in a class that gets a job is a new flow (as
// in FQ-CoDel): it is served before the tenants already backlogged, for up
// to one quantum, so a tenant that sends a job now and then does not queue
// behind a neighbour's thousands. A new flow that outlasts its quantum joins
// the round robin's tail like any backlogged tenant, so the shares of
// backlogged tenants stay weighted-fair. Pure data structure: no I/O, no
// goroutines, clock injected.
type Scheduler struct {
	quantum int
	weight  func(tenant string) int
	floors  map[job.Priority]float64
	window  time.Duration
	classes map[job.Priority]*classQueue
	// served records tokens dispatched per class, for the floors, with
	// running totals over it.
	served   []servedAt
	total    int
	perClass map[job.Priority]int
	n        int
	bytes    int
	tokens   int
}

type servedAt struct {
	at     time.Time
	class  job.Priority
	tokens int
}

// Item is one waiting job.
type Item struct {
	Tenant   string
	Priority job.Priority
	Cost     int // tokens reserved
	Size     int // bytes held
	Since    time.Time
	Value    any
	// Fresh is set by Pop when the job was served as part of its tenant's
	// new-flow quantum (it did not wait its turn behind backlogs).
	Fresh bool
	// Urgent is set by the caller: the job may use the headroom (an
	// interactive job, or one that started a new flow while others waited).
	Urgent bool
}

type classQueue struct {
	queues  map[string][]*Item
	fresh   []string // new flows, served first, each for up to one quantum
	ring    []string // backlogged tenants, in round-robin order
	cur     int
	topped  bool
	deficit map[string]int
}

// NewScheduler makes a scheduler. quantum is the tokens a tenant of weight 1
// earns per round; floors maps standard and batch to their minimum share.
func NewScheduler(quantum int, weight func(string) int, floors map[job.Priority]float64, window time.Duration) *Scheduler {
	s := &Scheduler{quantum: quantum, weight: weight, floors: floors, window: window, classes: map[job.Priority]*classQueue{}, perClass: map[job.Priority]int{}}
	for _, p := range job.Priorities {
		s.classes[p] = &classQueue{queues: map[string][]*Item{}, deficit: map[string]int{}}
	}
	return s
}

// Len returns how many jobs wait and the bytes they hold.
func (s *Scheduler) Len() (n, bytes int) { return s.n, s.bytes }

// Tokens returns the tokens the waiting jobs would reserve.
func (s *Scheduler) Tokens() int { return s.tokens }

// ClassLen returns how many jobs of class p wait.
func (s *Scheduler) ClassLen(p job.Priority) int {
	n := 0
	for _, tq := range s.classes[p].queues {
		n += len(tq)
	}
	return n
}

// Push adds a job at the tail of its tenant's queue.
func (s *Scheduler) Push(it *Item) {
	q := s.classes[it.Priority]
	if len(q.queues[it.Tenant]) == 0 {
		q.fresh = append(q.fresh, it.Tenant)
		q.deficit[it.Tenant] = s.quantum * max(s.weight(it.Tenant), 1)
	}
	q.queues[it.Tenant] = append(q.queues[it.Tenant], it)
	s.n++
	s.bytes += it.Size
	s.tokens += it.Cost
}

// PushFront adds a job at the head of its tenant's queue, with the deficit
// it was charged when it was served before given back: a job the provider
// refused for rate (Sluice's misjudgement) keeps its place.
func (s *Scheduler) PushFront(it *Item) {
	q := s.classes[it.Priority]
	if len(q.queues[it.Tenant]) == 0 {
		s.Push(it)
		return
	}
	q.queues[it.Tenant] = append([]*Item{it}, q.queues[it.Tenant]...)
	q.deficit[it.Tenant] += it.Cost
	s.n++
	s.bytes += it.Size
	s.tokens += it.Cost
}

// IsNew reports whether a job pushed now for tenant in class p would start a
// new flow while other tenants' jobs of the class wait.
func (s *Scheduler) IsNew(tenant string, p job.Priority) bool {
	q := s.classes[p]
	return len(q.queues[tenant]) == 0 && len(q.queues) > 0
}

// Unpop puts back a job Pop returned (its reservation failed): at the head
// of its tenant's queue, with the deficit it spent, its tenant next in turn.
func (s *Scheduler) Unpop(it *Item) {
	q := s.classes[it.Priority]
	switch {
	case it.Fresh && len(q.queues[it.Tenant]) == 0:
		q.fresh = append([]string{it.Tenant}, q.fresh...)
	case it.Fresh:
		// Still a new flow, at the head of the list.
	case len(q.queues[it.Tenant]) == 0:
		// Back into the ring at the current position: it goes next.
		pos := min(q.cur, len(q.ring))
		q.ring = append(q.ring[:pos], append([]string{it.Tenant}, q.ring[pos:]...)...)
		q.cur = pos
		q.topped = true
	}
	it.Fresh = false
	q.queues[it.Tenant] = append([]*Item{it}, q.queues[it.Tenant]...)
	q.deficit[it.Tenant] += it.Cost
	s.n++
	s.bytes += it.Size
	s.tokens += it.Cost
	s.unserve(it)
}

// Pop returns the next job in fair order, or nil when none waits.
func (s *Scheduler) Pop(now time.Time) *Item {
	c, ok := s.nextClass(now)
	if !ok {
		return nil
	}
	it := s.classes[c].pop(s.quantum, s.weight)
	s.n--
	s.bytes -= it.Size
	s.tokens -= it.Cost
	s.served = append(s.served, servedAt{at: now, class: c, tokens: it.Cost})
	s.total += it.Cost
	s.perClass[c] += it.Cost
	return it
}

func (s *Scheduler) unserve(it *Item) {
	for i := len(s.served) - 1; i >= 0; i-- {
		if s.served[i].class == it.Priority && s.served[i].tokens == it.Cost {
			s.served = append(s.served[:i], s.served[i+1:]...)
			s.total -= it.Cost
			s.perClass[it.Priority] -= it.Cost
			return
		}
	}
}

// nextClass picks the class to serve: a waiting class below its floor
// (the one furthest below), else the highest priority with waiting jobs.
func (s *Scheduler) nextClass(now time.Time) (job.Priority, bool) {
	from := now.Add(-s.window)
	k := 0
	for k < len(s.served) && s.served[k].at.Before(from) {
		s.total -= s.served[k].tokens
		s.perClass[s.served[k].class] -= s.served[k].tokens
		k++
	}
	s.served = s.served[k:] // the backing array is reused by append, amortized
	total, by := s.total, s.perClass
	best, worst := job.Priority(""), 0.0
	if total > 0 {
		for _, p := range job.Priorities {
			f := s.floors[p]
			if f <= 0 || !s.classes[p].waiting() {
				continue
			}
			short := f - float64(by[p])/float64(total)
			if short > worst {
				best, worst = p, short
			}
		}
	}
	if best != "" {
		return best, true
	}
	for _, p := range job.Priorities {
		if s.classes[p].waiting() {
			return p, true
		}
	}
	return "", false
}

func (q *classQueue) waiting() bool { return len(q.fresh) > 0 || len(q.ring) > 0 }

func (q *classQueue) pop(quantum int, weight func(string) int) *Item {
	for len(q.fresh) > 0 {
		t := q.fresh[0]
		if it := q.serve(t); it != nil {
			it.Fresh = true
			return it
		}
		// Its quantum is spent: it waits its turn with the backlogged,
		// keeping what is left of its deficit.
		q.fresh = q.fresh[1:]
		q.ring = append(q.ring, t)
	}
	for {
		q.cur %= len(q.ring)
		t := q.ring[q.cur]
		if !q.topped {
			q.deficit[t] += quantum * max(weight(t), 1)
			q.topped = true
		}
		if it := q.serve(t); it != nil {
			return it
		}
		q.cur++
		q.topped = false
	}
}

// serve takes tenant t's next job if its deficit covers the job's cost.
func (q *classQueue) serve(t string) *Item {
	tq := q.queues[t]
	if q.deficit[t] < tq[0].Cost {
		return nil
	}
	it := tq[0]
	q.deficit[t] -= it.Cost
	if len(tq) == 1 {
		q.drop(t)
	} else {
		q.queues[t] = tq[1:]
	}
	return it
}

// Each visits every waiting job (for visibility and eviction), in no
// particular order; fn returns false to stop.
func (s *Scheduler) Each(fn func(*Item) bool) {
	for _, q := range s.classes {
		for _, tq := range q.queues {
			for _, it := range tq {
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
		q := s.classes[job.Priorities[i]]
		most, who := 0, ""
		for t, tq := range q.queues {
			if len(tq) > most {
				most, who = len(tq), t
			}
		}
		if who == "" {
			continue
		}
		tq := q.queues[who]
		it := tq[len(tq)-1]
		if len(tq) == 1 {
			q.drop(who)
		} else {
			q.queues[who] = tq[:len(tq)-1]
		}
		s.n--
		s.bytes -= it.Size
		s.tokens -= it.Cost
		return it
	}
	return nil
}

// Remove drops items for which drop returns true (expired jobs); it returns them.
func (s *Scheduler) Remove(drop func(*Item) bool) []*Item {
	var out []*Item
	for _, q := range s.classes {
		for t, tq := range q.queues {
			keep := tq[:0]
			for _, it := range tq {
				if drop(it) {
					out = append(out, it)
					s.n--
					s.bytes -= it.Size
					s.tokens -= it.Cost
				} else {
					keep = append(keep, it)
				}
			}
			if len(keep) == 0 {
				q.drop(t)
			} else {
				q.queues[t] = keep
			}
		}
	}
	return out
}

// drop removes an emptied tenant from the class: its queue, its deficit (an
// idle tenant banks no credit) and its place in the ring. The tenant whose
// turn it is keeps its turn unless it is the one dropped.
func (q *classQueue) drop(t string) {
	delete(q.queues, t)
	delete(q.deficit, t)
	for k, x := range q.fresh {
		if x == t {
			q.fresh = append(q.fresh[:k], q.fresh[k+1:]...)
			return
		}
	}
	for k, x := range q.ring {
		if x != t {
			continue
		}
		q.ring = append(q.ring[:k], q.ring[k+1:]...)
		switch {
		case k < q.cur:
			q.cur--
		case k == q.cur:
			q.topped = false
		}
		break
	}
	if len(q.ring) > 0 {
		q.cur %= len(q.ring)
	} else {
		q.cur = 0
	}
}
