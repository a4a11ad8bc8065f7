package budget

import (
	"context"
	"math"
	"sort"
	"time"
)

// # Send-time pacing
//
// Providers judge the instant a request arrives, not the instant Sluice
// reserved budget for it, and they enforce more than the minute: OpenAI
// quantizes ("60,000 requests/minute may be enforced as 1,000
// requests/second"), Anthropic refills a token bucket continuously, Azure
// counts over 1- or 10-second windows. So a paced store does not hand out
// room in a slice: it plans, for every reservation, the instant its call may
// leave (SendAt), on one schedule per provider/model that every admission
// process shares through the KV bucket, and the executor sends no earlier
// than that instant and no later than Tolerance after it (or not at all).
//
// Placements on the schedule are monotone (each is at or after the last
// one, under compare-and-set), and a placement at instant s must satisfy,
// with every earlier placement:
//
//   - pacing: s is no earlier than the theoretical arrival time of each
//     dimension (GCRA, no burst tolerance): consecutive sends are spaced by
//     their cost at the minute limit's average rate, so a continuously
//     refilled token bucket of at least one job's capacity never runs dry;
//   - the short window: the placements in (s - Short - Tolerance, s] hold at
//     most the per-second cap, or s is alone there (a request larger than
//     the cap gets a window of its own, as providers admit it only into an
//     otherwise empty one);
//   - the minute: the slices of the last Window + Tolerance hold at most the
//     minute limit.
//
// One exception to "no burst tolerance": Limits.OutputTolerance, for
// Anthropic's OTPM, a bucket of a minute's capacity charged max_tokens at
// arrival and given back the unused rest when the call ends. There the
// output's pace may run that far ahead of its average, and the minute's
// output bound is that much higher, so calls in flight do not hold the
// schedule to their latency; the pace still bounds what the bucket gives
// out beyond its refill by the tolerance.
//
// Because placements are monotone, checking the window that ends at the
// newest placement checks every window. An executor may send up to
// Tolerance late, so each actual send lies in [s, s+Tolerance] and every
// window the provider looks at (length W, ending at an arrival a) holds only
// sends planned in (a - W - Tolerance, a]: a window of the plan that was
// checked. Hence the provider never sees more than the limits in any window
// it enforces, however many executors send. The cost is Tolerance/Short of
// the per-second cap (1.5 % with the default 15 ms) when that cap binds, and
// Tolerance/Window of the minute (a slice of the minute leaves it when its
// last placement does: Window.Ends).

// planned is one placement on a paced schedule: the cost in every
// dimension that may be sent at instant At (unix microseconds).
type planned struct {
	At int64
	V  Vec
}

func (p Params) paced() bool { return p.Short > 0 }

// lead is how far ahead of now a placement may be at the earliest.
func (s *Store) lead(now time.Time) time.Duration {
	if s.Lead != nil {
		return s.Lead(now)
	}
	return s.p.Lead
}

// shortUS is the short window plus the tolerance, in microseconds.
func (p Params) shortUS() int64 { return (p.Short + p.Tolerance).Microseconds() }

// minuteUS is the minute plus the tolerance, in microseconds.
func (p Params) minuteUS() int64 {
	w := p.Window
	if w == 0 {
		w = time.Minute
	}
	return (w + p.Tolerance).Microseconds()
}

// minuteFrom is the first slice the minute of a placement at instant at
// (unix microseconds) holds: the one with (at - minute - tolerance) in it.
// Every placement a call sent up to the tolerance late could share the
// provider's minute with lies in it or after; a fixed span of slices from
// the instant's own would hold up to a slice more than that (0.4 % of the
// minute left unused where the pace binds it).
func (s *Store) minuteFrom(at int64) int64 {
	return s.sliceOf(time.UnixMicro(at - s.p.minuteUS()))
}

// sliceEnd is the instant (unix microseconds) slice k of w leaves the
// minute from: its latest placement where w knows it, or its end.
func (s *Store) sliceEnd(w *Window, k int64) int64 {
	if e, ok := w.Ends[k]; ok {
		return s.sliceStart(k).UnixMicro() + e*1000
	}
	return s.sliceStart(k + 1).UnixMicro()
}

// minuteFirst is the first slice the minute of a placement at instant at
// holds: minuteFrom's, or the one after when all that slice placed is
// already out of it (a slice's end decided when its last placement could
// leave: up to a slice of the minute, 0.4 %, left unused where the minute
// binds).
func (s *Store) minuteFirst(w *Window, at int64) int64 {
	k := s.minuteFrom(at)
	if s.sliceEnd(w, k) <= at-s.p.minuteUS() {
		return k + 1
	}
	return k
}

// place plans costs on a paced schedule, each at the earliest instant that
// satisfies pacing, the short window and the minute, within the horizon, in
// every dimension the limits bound, lead from now at the earliest.
func (s *Store) place(w *Window, lim Limits, costs []Cost, notBefore []time.Time, now time.Time, lead time.Duration) Grant {
	mins, caps := lim.caps(s.p.BurstFraction)
	nowUS := now.UnixMicro()
	// Rounded to the nearest millisecond, not up with the instant below: the
	// lead is learned to be just long enough, and a placement with room
	// starts at the earliest instant, which then needs no rounding.
	earliest := (nowUS + lead.Microseconds() + 500) / 1000 * 1000
	h := s.p.Horizon
	if lim.Horizon > 0 {
		h = min(h, lim.Horizon)
	}
	horizon := nowUS + max(h, s.p.Lead).Microseconds()
	win := s.p.Window
	if win == 0 {
		win = time.Minute
	}
	per, paced := pacePer(mins, caps, win)
	minute := outputMinute(mins, lim.OutputTolerance, win)
	g := Grant{Slice: s.sliceOf(now)}
	if !paced {
		// Nothing to pace: every call may leave now.
		earliest = nowUS
	}
	for i, c := range costs {
		v := c.vec()
		at := max(earliest, w.Last)
		if i < len(notBefore) && !notBefore[i].IsZero() {
			at = max(at, notBefore[i].UnixMicro())
		}
		if !paced {
			at = earliest
		}
		paceReason := "" // the minute limit whose pace set the instant
		for d := range per {
			if per[d] > 0 {
				tat := w.TAT[d]
				if d == outDim {
					tat -= lim.OutputTolerance.Microseconds()
				}
				if tat > at {
					at, paceReason = tat, reasonOf(d)
				}
			}
		}
		reason := ""
		// credit is how far the short window alone moved the call past
		// its pace (below).
		var credit int64
		if paced {
			if a := s.shortFit(w, at, v, mins, caps); a > at {
				at, reason, credit = a, "burst", a-at
			}
			a, why := s.minuteFit(w, at, v, minute)
			if a < 0 {
				g.Reason, g.RetryAt = why, s.sliceStart(s.sliceOf(now)+s.p.Span())
				break
			}
			if a > at {
				at, reason, credit = a, why, credit+a-at
			}
		}
		if at > horizon {
			switch {
			case reason != "":
			case paceReason != "":
				reason = paceReason // paced beyond the horizon by a minute limit
			default:
				reason = "burst"
			}
			g.Reason = reason
			g.RetryAt = time.UnixMicro(at - (horizon - nowUS))
			break
		}
		// The call leaves at the next whole millisecond: placements share
		// instants, which bounds the schedule to one entry per millisecond
		// of the short window whatever the rate. Pacing keeps the exact
		// instant; the windows see the later one (safe: later placements
		// are checked against it).
		exact := at
		at = (at + 999) / 1000 * 1000
		from := at
		if paced && (i >= len(notBefore) || notBefore[i].IsZero()) && s.roomy(w, at, v, mins, caps, at-nowUS) {
			from = max(nowUS, w.Last)
		}
		s.record(w, at, exact, credit, v, per)
		sa := time.UnixMicro(at)
		g.SendAt = append(g.SendAt, sa)
		g.From = append(g.From, time.UnixMicro(from))
		g.ValidUntil = sa.Add(s.p.Tolerance)
		g.N++
	}
	return g
}

// record adds a placement of v at instant at (exact: before rounding to
// the millisecond) to w's schedule, its minute and its pace. The pace runs
// on from the instant it allowed, not from the later one the short window
// or the minute imposed (credit, what they imposed): a job paced shorter
// than the second it had to wait leaves that time to the next, paced
// longer, instead of losing it (jobs near the per-second cap filled 97 %
// of the minute, not 99 %); and a job that waited for the minute to free
// room does not make the next wait its whole pace again (TestMinuteFill:
// 97.7 % of the minute, 97.4 % without). At most one short window of
// it: the windows still hold every plan, and a bucket of a second's
// refill (what a cap of limit/60 stands for) holds a schedule whose every
// second holds at most the cap, one of a minute's one whose every minute
// holds at most the limit.
func (s *Store) record(w *Window, at, exact, credit int64, v Vec, per [dims]float64) {
	w.add(planned{At: at, V: v})
	k := s.sliceOf(time.UnixMicro(at))
	sv, had := w.Slices[k]
	end := (at - s.sliceStart(k).UnixMicro() + 999) / 1000
	if e, ok := w.Ends[k]; ok || !had {
		if w.Ends == nil {
			w.Ends = map[int64]int64{}
		}
		w.Ends[k] = max(e, end)
	}
	sv.add(v)
	w.Slices[k] = sv
	base := exact - min(credit, s.p.Short.Microseconds())
	for d := range per {
		if per[d] > 0 {
			w.TAT[d] = max(w.TAT[d], base) + int64(math.Ceil(per[d]*float64(v[d])))
		}
	}
	w.Last = exact
}

// pacePer is the microseconds per unit of each dimension at the minute's
// average rate, or at the per-second cap's if that is slower (a cap
// learned from the provider's refusals): sends spread evenly instead of
// bunching at the start of each second. 0: the dimension is unlimited;
// paced is false when every dimension is.
func pacePer(mins, caps Vec, win time.Duration) (per [dims]float64, paced bool) {
	for d, m := range mins {
		if m <= 0 {
			continue
		}
		paced = true
		per[d] = float64(win.Microseconds()) / float64(m)
		if caps[d] > 0 && caps[d] < math.MaxInt64 {
			per[d] = max(per[d], float64(time.Second.Microseconds())/float64(caps[d]))
		}
	}
	return per, paced
}

// outputMinute is the minute's bounds for placing: the minute counts a
// call's whole max_tokens until the call gives back what it did not use,
// so with an output tolerance (a bucket the provider refills, charged at
// arrival) the calls in flight may hold that much more than the limit: the
// pace, which the tolerance bounds, keeps the provider's bucket from
// running dry.
func outputMinute(mins Vec, tol, win time.Duration) Vec {
	if tol > 0 && mins[outDim] > 0 {
		mins[outDim] += mins[outDim] * tol.Microseconds() / win.Microseconds()
	}
	return mins
}

// roomy reports whether a call planned at instant at may leave as early as
// ahead before it (the grant's planning moment): the schedule then has
// room for it over that stretch too. A call that leaves early lies in
// windows that end before its instant, which the placement's own checks
// did not count: so the pace must already allow it at the earlier moment,
// and the short window and the minute, both stretched back by ahead, must
// hold it. Later placements check windows that hold its instant, which an
// early send does not leave. Only the planning, not the instants, changes.
func (s *Store) roomy(w *Window, at int64, v, mins, caps Vec, ahead int64) bool {
	if ahead <= 0 {
		return true
	}
	early := at - ahead
	if early < w.Last {
		return false
	}
	for d := range mins {
		if mins[d] > 0 && w.TAT[d] > early {
			return false
		}
	}
	var short Vec
	for _, p := range w.P {
		if p.At > early-s.p.shortUS() {
			short.add(p.V)
		}
	}
	minute := w.sum(s.minuteFirst(w, early))
	for d := range mins {
		if mins[d] <= 0 {
			continue
		}
		if short[d] > 0 && short[d]+v[d] > caps[d] {
			return false
		}
		if minute[d]+v[d] > mins[d] {
			return false
		}
	}
	return true
}

// shortFit returns the earliest instant at or after at where the short
// window (length Short+Tolerance, ending at the instant) has room for cost
// v in every limited dimension, or holds nothing.
func (s *Store) shortFit(w *Window, at int64, v, mins, caps Vec) int64 {
	capped := false
	for d := range mins {
		if mins[d] > 0 && caps[d] != math.MaxInt64 {
			capped = true
		}
	}
	if !capped {
		return at
	}
	span := s.p.shortUS()
	ps := w.P
	// The first placement inside (at-span, at], and the sums from it on.
	i := sort.Search(len(ps), func(i int) bool { return ps[i].At > at-span })
	var sum Vec
	for _, p := range ps[i:] {
		sum.add(p.V)
	}
	for i < len(ps) {
		if !sum.any() {
			return at // nothing is sent in this window
		}
		ok := true
		for d := range sum {
			if mins[d] > 0 && sum[d]+v[d] > caps[d] {
				ok = false
				break
			}
		}
		if ok {
			return at
		}
		// Wait until placement i leaves the window.
		at = max(at, ps[i].At+span)
		sum.take(ps[i].V)
		i++
		for i < len(ps) && ps[i].At <= at-span {
			sum.take(ps[i].V)
			i++
		}
	}
	return at // alone in its window
}

// minuteFit returns the earliest instant at or after at where the minute's
// slices have room for cost v, with the limit that bound ("rpm", "tpm" or
// "units"), or -1 when the cost exceeds a limit even in an empty window.
func (s *Store) minuteFit(w *Window, at int64, v, mins Vec) (int64, string) {
	for d := range v {
		if mins[d] > 0 && v[d] > mins[d] {
			return -1, reasonOf(d)
		}
	}
	from := s.minuteFirst(w, at)
	used := w.sum(from)
	var need Vec
	why := ""
	for d := range need {
		if mins[d] > 0 {
			need[d] = used[d] + v[d] - mins[d]
		}
		if need[d] > 0 && why == "" {
			why = reasonOf(d)
		}
	}
	if why == "" {
		return at, ""
	}
	var freed Vec
	for _, j := range w.keys() {
		if j < from {
			continue
		}
		freed.add(w.Slices[j])
		done := true
		for d := range need {
			if freed[d] < need[d] {
				done = false
				break
			}
		}
		if done {
			// Slice j leaves the minute once the minute and the
			// tolerance before the instant are past its end.
			return max(at, s.sliceEnd(w, j)+s.p.minuteUS()), why
		}
	}
	return -1, why
}

// add inserts p, keeping w.P sorted (placements are monotone, so this
// appends, merging with an entry at the same instant).
func (w *Window) add(p planned) {
	n := len(w.P)
	if n > 0 && w.P[n-1].At == p.At {
		w.P[n-1].V.add(p.V)
		return
	}
	if n == 0 || w.P[n-1].At < p.At {
		w.P = append(w.P, p)
		return
	}
	i := sort.Search(n, func(i int) bool { return w.P[i].At >= p.At })
	if w.P[i].At == p.At {
		w.P[i].V.add(p.V)
		return
	}
	w.P = append(w.P, planned{})
	copy(w.P[i+1:], w.P[i:])
	w.P[i] = p
}

// prunePlanned drops placements no window can hold any more.
func (s *Store) prunePlanned(w *Window, now time.Time) {
	if len(w.P) == 0 {
		return
	}
	cut := now.UnixMicro() - s.p.shortUS() - s.p.Tolerance.Microseconds()
	i := sort.Search(len(w.P), func(i int) bool { return w.P[i].At > cut })
	if i > 0 {
		w.P = append(w.P[:0], w.P[i:]...)
	}
}

// ReturnAt gives back cost planned at instant at and not sent (a lease's
// leftover, tokens a refused call was not charged): from the minute's slice
// and from the placement. Pacing is not rewound: later placements were
// spaced after it, and the time is simply not used.
func (s *Store) ReturnAt(ctx context.Context, key string, at time.Time, c Cost) error {
	return s.returnAt(ctx, key, at, c, false)
}

// ReturnLapsed is ReturnAt for an instant an executor let lapse without a
// call; it also rewinds the pacing when that leaves the placement empty and
// it was the last on the schedule, so the next plan may take its place
// (kept, a lapsed instant on a model allowed one request a minute would
// hold the job back a whole minute). The windows still bound every plan.
func (s *Store) ReturnLapsed(ctx context.Context, key string, at time.Time, c Cost) error {
	return s.returnAt(ctx, key, at, c, true)
}

func (s *Store) returnAt(ctx context.Context, key string, at time.Time, c Cost, rewind bool) error {
	if !c.Positive() {
		return nil
	}
	return s.ReturnAll(ctx, key, []Return{{At: at, Cost: c}}, rewind)
}

// giveBack takes cv off w at instant at (ReturnAt; rewind: ReturnLapsed)
// and reports whether w changed.
func (s *Store) giveBack(w *Window, cur int64, at time.Time, cv Vec, rewind bool) bool {
	i, ok := s.subtract(w, cur, at, cv)
	if !ok {
		return false
	}
	us := at.UnixMicro()
	if i >= 0 {
		last := rewind && !w.P[i].V.any()
		for _, p := range w.P[i+1:] {
			if p.V.any() {
				last = false
				break
			}
		}
		if last {
			for d := range w.TAT {
				w.TAT[d] = min(w.TAT[d], us)
			}
		}
	} else if rewind && w.Last != 0 && (w.Last+999)/1000*1000 == us {
		// The placement is gone from the schedule (given back more
		// than a short window after its instant) but was the newest:
		// nothing was spaced after it.
		for d := range w.TAT {
			w.TAT[d] = min(w.TAT[d], us)
		}
	}
	return true
}

// subtract takes cv off the minute's slice and the placement at instant
// at. It reports false when the slice has left the window (nothing to
// change), and the placement's index, or -1 when none is at that instant.
func (s *Store) subtract(w *Window, cur int64, at time.Time, cv Vec) (int, bool) {
	k := s.sliceOf(at)
	if k < cur-s.p.Span()+1 {
		return -1, false
	}
	if v, ok := w.Slices[k]; ok {
		v.sub(cv)
		w.Slices[k] = v
	}
	us := at.UnixMicro()
	i := sort.Search(len(w.P), func(i int) bool { return w.P[i].At >= us })
	if i < len(w.P) && w.P[i].At == us {
		w.P[i].V.sub(cv)
		return i, true
	}
	return -1, true
}

// Recent returns what the schedule holds in the short window that ends at
// instant at, less own (the refused request itself): what the provider saw
// in the second before a request it refused, as far as the fleet knows.
func (s *Store) Recent(ctx context.Context, key string, at time.Time, own Cost) (Cost, error) {
	w, _, err := s.load(ctx, key)
	if err != nil {
		return Cost{}, err
	}
	us := at.UnixMicro()
	from := us - s.p.Short.Microseconds()
	var sum Vec
	for _, p := range w.P {
		if p.At > from && p.At <= us {
			sum.add(p.V)
		}
	}
	sum.sub(own.vec())
	return costOf(sum), nil
}
