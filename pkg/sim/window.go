package sim

import (
	"sort"
	"time"
)

// dim is one quantity a charge carries.
type dim int

const (
	dimReqs dim = iota // arrivals, admitted or rejected: what RPM counts
	dimAdm             // admitted arrivals
	dimTok             // tokens charged (admitted arrivals only)
	nDims
)

// counts holds one value per dim.
type counts [nDims]int64

func (c counts) plus(d counts) counts {
	for i := range c {
		c[i] += d[i]
	}
	return c
}

func (c counts) minus(d counts) counts {
	for i := range c {
		c[i] -= d[i]
	}
	return c
}

func (c counts) atLeast(d counts) counts {
	for i := range c {
		c[i] = max(c[i], d[i])
	}
	return c
}

// win names one of the two trailing windows a chargeLog tracks.
type win int

const (
	winMinute win = iota
	winSecond
	nWins
)

func (w win) span() int64 {
	if w == winMinute {
		return int64(time.Minute)
	}
	return int64(time.Second)
}

// event is everything charged at one instant.
type event struct {
	at  int64  // unix nanoseconds
	own counts // charged at this instant
	cum counts // running totals up to and including this event
}

// chargeLog is an exact, time-ordered record of the charges of the last
// minute. A window (now-span, now] is a suffix of the log: lo[w] is its first
// event. Running totals make any window's sum, and the prefix of it that must
// expire before some amount is free, computable in O(1) and O(log n).
type chargeLog struct {
	ev      []event
	lo      [nWins]int
	total   counts        // cum of the newest event (or of everything compacted away)
	peak    [nWins]counts // largest sum any window has held
	lastTok int64         // instant of the newest token-bearing charge
}

// compactAt is how many expired events may pile up before they are dropped.
const compactAt = 4096

// advance drops charges that left the windows by now and returns now, moved
// forward to the newest charge if the clock stepped back.
func (l *chargeLog) advance(now int64) int64 {
	if n := len(l.ev); n > 0 {
		now = max(now, l.ev[n-1].at)
	}
	for w := range nWins {
		cutoff := now - w.span()
		for l.lo[w] < len(l.ev) && l.ev[l.lo[w]].at <= cutoff {
			l.lo[w]++
		}
	}
	l.compact()
	return now
}

func (l *chargeLog) compact() {
	drop := l.lo[winMinute]
	if drop < compactAt || drop*2 < len(l.ev) {
		return
	}
	n := copy(l.ev, l.ev[drop:])
	l.ev = l.ev[:n]
	for w := range nWins {
		l.lo[w] -= drop
	}
}

// before is the running total just before window w's first event.
func (l *chargeLog) before(w win) counts {
	if l.lo[w] == len(l.ev) {
		return l.total
	}
	e := l.ev[l.lo[w]]
	return e.cum.minus(e.own)
}

// used is what window w holds.
func (l *chargeLog) used(w win) counts {
	return l.total.minus(l.before(w))
}

// add records c charged at now, which must be the value advance returned.
func (l *chargeLog) add(now int64, c counts) {
	l.total = l.total.plus(c)
	if n := len(l.ev); n > 0 && l.ev[n-1].at == now {
		l.ev[n-1].own = l.ev[n-1].own.plus(c)
		l.ev[n-1].cum = l.total
	} else {
		l.ev = append(l.ev, event{at: now, own: c, cum: l.total})
	}
	if c[dimTok] > 0 {
		l.lastTok = now
	}
	for w := range nWins {
		l.peak[w] = l.peak[w].atLeast(l.used(w))
	}
}

// wait returns how long until at least need of dimension d has left window w,
// or false if the window does not hold that much.
func (l *chargeLog) wait(w win, d dim, need, now int64) (time.Duration, bool) {
	if need <= 0 {
		return 0, true
	}
	base := l.before(w)[d]
	ev := l.ev[l.lo[w]:]
	i := sort.Search(len(ev), func(i int) bool { return ev[i].cum[d]-base >= need })
	if i == len(ev) {
		return 0, false
	}
	return time.Duration(ev[i].at + w.span() - now), true
}

// resetIn returns how long until window w holds nothing of dimension d.
func (l *chargeLog) resetIn(d dim, now int64) time.Duration {
	if l.used(winMinute)[d] == 0 {
		return 0
	}
	last := l.ev[len(l.ev)-1].at
	if d == dimTok {
		last = l.lastTok
	}
	return time.Duration(last + winMinute.span() - now)
}
