package budget

import (
	"context"
	"sort"
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
		k := s.sliceOf(at)
		if k < cur-s.p.Span()+1 {
			return false
		}
		if v, ok := w.Slices[k]; ok {
			v.sub(cv)
			w.Slices[k] = v
		}
		us := at.UnixMicro()
		i := sort.Search(len(w.P), func(i int) bool { return w.P[i].At >= us })
		if i < len(w.P) && w.P[i].At == us {
			w.P[i].V.sub(cv)
		}
		for d, m := range mins {
			if m > 0 && cv[d] > 0 {
				w.TAT[d] -= win.Microseconds() * cv[d] / m
			}
		}
		return true
	})
}
