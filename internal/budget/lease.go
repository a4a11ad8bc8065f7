package budget

import (
	"context"
	"time"
)

// Lease is one process's share of a window: blocks of room taken from the
// shared window with one compare-and-set and spent locally by the jobs that
// arrive while they last, so the KV is not touched per job. On a paced store
// a block is room at one send instant, spendable until shortly before it
// (Spend's lead); on a plain store (tenant budgets) it is room in one slice,
// spendable while that slice is current. What a block has left when it can
// no longer be spent goes back to the window (Expire). Admission holds one
// Lease per model window and one per tenant window: the same mechanism.
type Lease struct {
	st     *Store
	key    string
	blocks []*Block
	// Demand seen in the current tick and smoothed per tick (every
	// dimension), for all jobs and for urgent ones.
	tick                 int64
	asked, askedUrgent   Cost
	demand, demandUrgent [dims]float64
	// rewind, when set, is the pace what goes back is rewound at
	// (RewindReturns).
	rewind *Limits
}

// RewindReturns makes what the lease gives back on a paced store also move
// the schedule's theoretical arrival times back, at lim's pace (as
// ReturnRewind), for a provider that refills a bucket: room it never saw
// used is room it still has. Without it, a block given back after later
// placements leaves the pace where the block put it, and a model whose
// blocks often expire unspent fills less than its limit.
func (l *Lease) RewindReturns(lim Limits) { l.rewind = &lim }

// Block is room left at an instant (paced) or in a slice (plain). Urgent
// blocks were taken against the full limits for jobs that should not wait;
// only those may spend them.
type Block struct {
	At     time.Time // paced: the send instant
	Slice  int64
	Left   Cost
	Urgent bool
}

// NewLease makes an empty lease on key.
func NewLease(st *Store, key string) *Lease { return &Lease{st: st, key: key, tick: -1} }

// Store returns the lease's store.
func (l *Lease) Store() *Store { return l.st }

// Count records new demand at now; demand is smoothed per tick (a slice of
// the store), for sizing the next blocks.
func (l *Lease) Count(c Cost, urgent bool, now time.Time) {
	l.roll(now)
	l.asked = l.asked.Plus(c)
	if urgent {
		l.askedUrgent = l.askedUrgent.Plus(c)
	}
}

// roll closes the demand tick when the slice turns.
func (l *Lease) roll(now time.Time) {
	k := l.st.SliceOf(now)
	if k == l.tick {
		return
	}
	const a = 0.3
	smooth := func(d *[dims]float64, c Cost) {
		for i, x := range c.vec() {
			d[i] = (1-a)*d[i] + a*float64(x)
		}
	}
	smooth(&l.demand, l.asked)
	smooth(&l.demandUrgent, l.askedUrgent)
	l.tick, l.asked, l.askedUrgent = k, Cost{}, Cost{}
}

// Demand returns the smoothed demand per tick, or what this tick has seen
// if more (a stream that just started).
func (l *Lease) Demand(urgent bool, now time.Time) Cost {
	l.roll(now)
	d, a := l.demand, l.asked
	if urgent {
		d, a = l.demandUrgent, l.askedUrgent
	}
	var v Vec
	for i, x := range a.vec() {
		v[i] = max(int64(d[i]), x)
	}
	return costOf(v)
}

// usable reports whether b may still be spent at now: a paced block until
// lead before its instant, a plain one while its slice is current.
func (l *Lease) usable(b *Block, now time.Time, lead time.Duration) bool {
	if l.st.p.paced() {
		return b.At.After(now.Add(lead))
	}
	return b.Slice == l.st.SliceOf(now)
}

// Spend takes c from the earliest usable block with room (urgent callers
// their own blocks first; others never touch urgent blocks) and returns it.
func (l *Lease) Spend(c Cost, urgent bool, now time.Time, lead time.Duration) (Block, bool) {
	// Spent blocks leave the list (nothing to give back), so a backlog
	// admitted at thousands of jobs a second scans a few blocks, not all
	// it took in the tick.
	keep := l.blocks[:0]
	for _, b := range l.blocks {
		if b.Left.Positive() {
			keep = append(keep, b)
		}
	}
	clear(l.blocks[len(keep):])
	l.blocks = keep
	for pass := 0; pass < 2; pass++ {
		for _, b := range l.blocks {
			if b.Urgent != (pass == 0) || (b.Urgent && !urgent) || !l.usable(b, now, lead) {
				continue
			}
			if c.Within(b.Left) {
				b.Left = b.Left.Minus(c)
				return *b, true
			}
		}
	}
	return Block{}, false
}

// Refund gives c back to the block it was spent from while that block is
// usable, else to the shared window.
func (l *Lease) Refund(ctx context.Context, from Block, c Cost, now time.Time) {
	for _, b := range l.blocks {
		if b.Slice == from.Slice && b.At.Equal(from.At) && b.Urgent == from.Urgent && l.usable(b, now, 0) {
			b.Left = b.Left.Plus(c)
			return
		}
	}
	l.giveBack(ctx, from, c)
}

// Take reserves rest from the shared window (the jobs not covered by a
// block) together with extra room, with one compare-and-set: the jobs get
// the prefix granted, the extra room granted stays as blocks. On a paced
// store the extra room is spread over the coming spread (room for demand
// expected during it, so arrivals find a block at an instant near theirs);
// 0 places it as early as it fits (room for a backlog). It returns the
// store's grant for rest alone (N at most len(rest)).
func (l *Lease) Take(ctx context.Context, lim Limits, rest, extra []Cost, urgent bool, spread time.Duration) (Grant, error) {
	// Blocks that can no longer be spent go back first: the window must
	// not count them against what is asked now.
	l.Expire(ctx, l.st.now(), false)
	costs := append(append(make([]Cost, 0, len(rest)+len(extra)), rest...), extra...)
	var notBefore []time.Time
	if spread > 0 && len(extra) > 0 {
		now := l.st.now()
		notBefore = make([]time.Time, len(costs))
		for i := range extra {
			notBefore[len(rest)+i] = now.Add(spread * time.Duration(i) / time.Duration(len(extra)))
		}
	}
	g, err := l.st.TakeAt(ctx, l.key, lim, costs, notBefore)
	if err != nil {
		return g, err
	}
	granted := min(g.N, len(rest))
	for i := granted; i < g.N; i++ {
		b := &Block{Slice: g.Slice, Left: costs[i], Urgent: urgent}
		if len(g.SendAt) > i {
			b.At = g.SendAt[i]
			b.Slice = l.st.SliceOf(b.At)
		}
		l.blocks = append(l.blocks, b)
	}
	g.N = granted
	if len(g.SendAt) > granted {
		g.SendAt = g.SendAt[:granted]
	}
	return g, nil
}

// Expire gives back what is left of blocks that can no longer be spent
// (every block when all is set: shutdown), on a paced store in one write.
func (l *Lease) Expire(ctx context.Context, now time.Time, all bool) {
	keep := l.blocks[:0]
	var back []Return
	for _, b := range l.blocks {
		switch {
		case !all && l.usable(b, now, 0):
			keep = append(keep, b)
		case l.st.p.paced():
			if b.Left.Positive() {
				back = append(back, Return{At: b.At, Cost: b.Left})
			}
		default:
			l.giveBack(ctx, *b, b.Left)
		}
	}
	clear(l.blocks[len(keep):])
	l.blocks = keep
	switch {
	case len(back) == 0:
	case l.rewind != nil:
		_ = l.st.ReturnRewindAll(ctx, l.key, back, *l.rewind)
	default:
		_ = l.st.ReturnAll(ctx, l.key, back, false)
	}
}

func (l *Lease) giveBack(ctx context.Context, b Block, c Cost) {
	if !c.Positive() {
		return
	}
	if l.st.p.paced() {
		if l.rewind != nil {
			_ = l.st.ReturnRewind(ctx, l.key, b.At, c, *l.rewind)
			return
		}
		_ = l.st.ReturnAt(ctx, l.key, b.At, c)
		return
	}
	_ = l.st.Return(ctx, l.key, b.Slice, c)
}
