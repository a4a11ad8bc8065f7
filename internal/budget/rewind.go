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
	win := s.p.Window
	if win == 0 {
		win = time.Minute
	}
	cv := c.vec()
	mins := lim.minute()
	return s.modify(ctx, key, "return", func(w *Window, cur int64) bool {
		if _, ok := s.subtract(w, cur, at, cv); !ok {
			return false
		}
		for d, m := range mins {
			if m > 0 && cv[d] > 0 {
				w.TAT[d] -= win.Microseconds() * cv[d] / m
			}
		}
		return true
	})
}
