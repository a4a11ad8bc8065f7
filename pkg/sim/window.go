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

// win names one of the trailing windows a chargeLog tracks. The minute must
// stay the longest: compaction keeps what it holds.
type win int

const (
	winMinute win = iota // RPM and TPM, every profile
	winSecond            // the 1-s quantum (quantized, acceleration, hidden)
	winTen               // azure's 10-s window; the acceleration ramp's trailing 10 s
	winTwenty            // the acceleration ramp: (t-20s, t-10s] is winTwenty less winTen
	nWins
)

var spans = [nWins]int64{int64(time.Minute), int64(time.Second), int64(10 * time.Second), int64(20 * time.Second)}

func (w win) span() int64 { return spans[w] }

// seconds is the span in seconds.
func (w win) seconds() float64 { return time.Duration(w.span()).Seconds() }

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
	return l.cumBefore(l.lo[w])
}

// cumBefore is the running total just before event i (the total if i is
// past the newest).
func (l *chargeLog) cumBefore(i int) counts {
	if i == len(l.ev) {
		return l.total
	}
	e := l.ev[i]
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

// ramp returns what (t-10s, t] and (t-20s, t-10s] hold at the last instant
// advance was given.
func (l *chargeLog) ramp() (recent, previous counts) {
	recent = l.used(winTen)
	return recent, l.used(winTwenty).minus(recent)
}

// rampFrom returns the first instant t >= from at which fits holds for what
// (t-10s, t] and (t-20s, t-10s] will hold if nothing more is charged. from
// must not precede the newest charge. Both sums change only at the instants
// e+10s and e+20s of the charges e, so only from and those instants are
// tried. A (t-10s, t] that holds no charge is taken to fit, which ends the
// search by the newest charge's e+10s.
func (l *chargeLog) rampFrom(from int64, fits func(recent, previous counts) bool) int64 {
	ten, twenty := winTen.span(), winTwenty.span()
	ev := l.ev
	// Events [iB, iA) are in (t-20s, t-10s], events [iA, len) in (t-10s, t].
	iA := sort.Search(len(ev), func(i int) bool { return ev[i].at > from-ten })
	iB := sort.Search(iA, func(i int) bool { return ev[i].at > from-twenty })
	for t := from; ; {
		mid := l.cumBefore(iA)
		if iA == len(ev) || fits(l.total.minus(mid), mid.minus(l.cumBefore(iB))) {
			return t
		}
		// The next change: the oldest recent charge moving to the previous
		// 10 s, or the oldest previous one leaving it.
		t = ev[iA].at + ten
		if iB < iA {
			t = min(t, ev[iB].at+twenty)
		}
		for iA < len(ev) && ev[iA].at <= t-ten {
			iA++
		}
		for iB < iA && ev[iB].at <= t-twenty {
			iB++
		}
	}
}
