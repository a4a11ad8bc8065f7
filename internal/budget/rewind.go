package budget

import (
	"context"
	"time"
)

// ReturnRewind is ReturnAt for a provider that refills a bucket and
// charges what it counted (Anthropic): it also moves each dimension's
// theoretical arrival time back by what the returned amount advanced it at
// lim's average pace, so the schedule paces what the provider was charged,
// not what was reserved. Pass limits no lower than those placed with (the
// configured ones): a faster pace rewinds less, which errs towards the
// limit. Placements stay monotone (none is planned before the newest), and
// the minute still bounds every plan.
func (s *Store) ReturnRewind(ctx context.Context, key string, at time.Time, c Cost, lim Limits) error {
	if !c.Positive() || !s.p.paced() {
		return s.ReturnAt(ctx, key, at, c)
	}
	return s.ReturnRewindAll(ctx, key, []Return{{At: at, Cost: c}}, lim)
}

// Return is an amount given back at the instant it was placed at.
type Return struct {
	At   time.Time
	Cost Cost
}

// ReturnRewindAll is ReturnRewind for several returns in one
// compare-and-set: a give-back that arrives while another is being written
// joins the next write instead of being dropped or costing a write of its
// own. A return whose instant has left the window is skipped.
func (s *Store) ReturnRewindAll(ctx context.Context, key string, rs []Return, lim Limits) error {
	if len(rs) == 1 && !s.p.paced() {
		return s.ReturnAt(ctx, key, rs[0].At, rs[0].Cost)
	}
	return s.write(ctx, key, &Op{Kind: OpRewind, Returns: rs, Lim: lim})
}

// rewindAll applies ReturnRewindAll's returns to w.
func (s *Store) rewindAll(w *Window, cur int64, rs []Return, lim Limits) bool {
	win := s.p.Window
	if win == 0 {
		win = time.Minute
	}
	var back Vec
	for _, r := range rs {
		if !r.Cost.Positive() {
			continue
		}
		cv := r.Cost.vec()
		if _, ok := s.subtract(w, cur, r.At, cv); ok {
			back.add(cv)
		}
	}
	if !back.any() {
		return false
	}
	if s.p.paced() {
		for d, m := range lim.minute() {
			if m > 0 && back[d] > 0 {
				w.TAT[d] -= win.Microseconds() * back[d] / m
			}
		}
	}
	return true
}

// ReturnAll is ReturnAt (lapsed: ReturnLapsed) for several returns in one
// compare-and-set, in their order. A return whose instant has left the
// window is skipped.
func (s *Store) ReturnAll(ctx context.Context, key string, rs []Return, lapsed bool) error {
	k := OpReturn
	if lapsed {
		k = OpLapsed
	}
	return s.write(ctx, key, &Op{Kind: k, Returns: rs})
}

// returnAll applies ReturnAll's returns to w.
func (s *Store) returnAll(w *Window, cur int64, rs []Return, lapsed bool) bool {
	changed := false
	for _, r := range rs {
		if r.Cost.Positive() && s.giveBack(w, cur, r.At, r.Cost.vec(), lapsed) {
			changed = true
		}
	}
	return changed
}

// Settlement is extra charged to the slice a reservation was made in.
type Settlement struct {
	Slice int64
	Extra Cost
}

// SettleAll is Settle for several settlements in one compare-and-set.
func (s *Store) SettleAll(ctx context.Context, key string, ss []Settlement) error {
	return s.write(ctx, key, &Op{Kind: OpSettle, Settles: ss})
}

// settleAll applies SettleAll's settlements to w.
func (s *Store) settleAll(w *Window, cur int64, ss []Settlement) bool {
	changed := false
	for _, st := range ss {
		if st.Extra.Positive() && s.charge(w, cur, st.Slice, st.Extra) {
			changed = true
		}
	}
	return changed
}
