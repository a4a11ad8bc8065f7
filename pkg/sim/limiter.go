package sim

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// limits are one model's limits under a profile; zero means not enforced.
type limits struct {
	rpm, tpm int64
	// short is the window of the short caps shortReqs and shortToks: the
	// 1-s quantum, or azure's 10 s. Both caps are 0 in a profile without
	// one.
	short                win
	shortReqs, shortToks int64
	// bucketMS is the token buckets' capacity in milliseconds of refill
	// (token-bucket only).
	bucketMS int64
	// growth is AccelGrowth and rampReqs and rampToks the ramp's floors,
	// floor(limit/6·AccelFloor) (acceleration only: growth is 0 otherwise).
	growth             float64
	rampReqs, rampToks int64
}

func newLimits(m ModelLimits, c Config) limits {
	l := limits{rpm: int64(m.RPM), tpm: int64(m.TPM), short: winSecond}
	switch c.Profile {
	case ProfileTokenBucket:
		l.bucketMS = bucketMillis(c.BucketSeconds)
	case ProfileAzure:
		l.short = winTen
		l.shortReqs, l.shortToks = burstCap(l.rpm, 1.0/6), burstCap(l.tpm, 1.0/6)
	default:
		l.shortReqs, l.shortToks = burstCap(l.rpm, c.BurstFraction), burstCap(l.tpm, c.BurstFraction)
	}
	if c.Profile == ProfileAcceleration {
		l.growth = c.AccelGrowth
		l.rampReqs, l.rampToks = share(l.rpm, c.AccelFloor/6, false), share(l.tpm, c.AccelFloor/6, false)
	}
	return l
}

// burstCap is max(ceil(limit·fraction), 1), or 0 (unlimited) for limit 0.
func burstCap(limit int64, fraction float64) int64 {
	if limit == 0 {
		return 0
	}
	return max(share(limit, fraction, true), 1)
}

// share is limit·fraction rounded up or down. A fraction 1/n is computed in
// integers, so that 600/60 is 10 and 10^12/60 rounds right; any other in
// floating point, with a hair taken off before rounding up (added before
// rounding down) so that 600·0.3 is 180, not 181.
func share(limit int64, fraction float64, up bool) int64 {
	if n := math.Round(1 / fraction); n >= 1 && n < 1<<53 && math.Abs(1/fraction-n) < 1e-9*n {
		d := int64(n)
		if up {
			return (limit + d - 1) / d
		}
		return limit / d
	}
	if up {
		return int64(math.Ceil(float64(limit)*fraction - 1e-9))
	}
	return int64(math.Floor(float64(limit)*fraction + 1e-9))
}

// constraint is one of the limits a request must fit. Requests and tokens
// alternate: the odd constraints count tokens.
type constraint int

const (
	rpmMinute constraint = iota // requests over the 60-s window
	tpmMinute                   // tokens over the 60-s window
	rpmShort                    // requests over the short window
	tpmShort                    // tokens over the short window
	rpmBucket                   // the requests bucket
	tpmBucket                   // the tokens bucket
	rpmRamp                     // the acceleration ramp of requests
	tpmRamp                     // the acceleration ramp of tokens
	nConstraints
)

// reasonTooLarge counts, next to the constraints, requests larger than TPM.
const reasonTooLarge = nConstraints

// reasonNames key Stats' RateLimitedBy.
var reasonNames = [nConstraints + 1]string{
	"requests_per_minute", "tokens_per_minute",
	"requests_short_window", "tokens_short_window",
	"requests_bucket", "tokens_bucket",
	"requests_acceleration", "tokens_acceleration",
	"too_large",
}

func (c constraint) tokens() bool { return c%2 == 1 }

// dim is the dimension c counts. Windows count every arrival against the
// request limits, as RPM does; the ramp counts admitted requests only, so
// that rejections never raise what it allows.
func (c constraint) dim() dim {
	switch {
	case c.tokens():
		return dimTok
	case c == rpmRamp:
		return dimAdm
	}
	return dimReqs
}

// amount is what a request costing cost tokens adds to c's dimension.
func (c constraint) amount(cost int64) int64 {
	if c.tokens() {
		return cost
	}
	return 1
}

// kind is OpenAI's error type for the constraint: "requests" or "tokens".
func (c constraint) kind() string {
	if c.tokens() {
		return "tokens"
	}
	return "requests"
}

// win is the window of a window constraint, and winTen (what the ramp
// limits) for the ramp.
func (l limits) win(c constraint) win {
	switch c {
	case rpmMinute, tpmMinute:
		return winMinute
	case rpmShort, tpmShort:
		return l.short
	}
	return winTen
}

// window is the cap of window constraint c (0 for the others).
func (l limits) window(c constraint) int64 {
	switch c {
	case rpmMinute:
		return l.rpm
	case tpmMinute:
		return l.tpm
	case rpmShort:
		return l.shortReqs
	case tpmShort:
		return l.shortToks
	}
	return 0
}

// need returns how much of window constraint c's dimension must leave its
// window (which holds used) before a request costing cost fits; <= 0 means
// it fits now. A request alone in its short window passes the short cap
// whatever its cost.
func (l limits) need(c constraint, used, cost int64) int64 {
	lim := l.window(c)
	if lim == 0 {
		return 0
	}
	n := used + c.amount(cost) - lim
	if c == rpmShort || c == tpmShort {
		n = min(n, used)
	}
	return n
}

// ramps reports whether the ramp constraint c is enforced.
func (l limits) ramps(c constraint) bool {
	if l.growth == 0 {
		return false
	}
	if c.tokens() {
		return l.tpm > 0
	}
	return l.rpm > 0
}

// rampCap is the most ramp constraint c lets (t-10s, t] hold when
// (t-20s, t-10s] holds previous: the floor, or growth·previous if larger.
func (l limits) rampCap(c constraint, previous int64) int64 {
	floor := l.rampReqs
	if c.tokens() {
		floor = l.rampToks
	}
	g := l.growth * float64(previous)
	if g >= 1<<62 {
		return 1 << 62
	}
	return max(floor, int64(math.Floor(g+1e-9)))
}

// rampFits reports whether a request costing cost passes ramp constraint c
// when (t-10s, t] holds recent and (t-20s, t-10s] previous. A request alone
// in its 10 s always passes.
func (l limits) rampFits(c constraint, recent, previous counts, cost int64) bool {
	if !l.ramps(c) {
		return true
	}
	r := recent[c.dim()]
	return r == 0 || r+c.amount(cost) <= l.rampCap(c, previous[c.dim()])
}

// decision is the outcome of one arrival.
type decision struct {
	admitted bool
	at       int64 // arrival instant, unix nanoseconds
	rate     rateHeaders

	// Set when rejected.
	tooLarge  bool // cost exceeds TPM: it can never run
	reason    constraint
	used      int64 // what reason's window held before the arrival (bucket: what it lacked of full)
	limit     int64 // reason's cap then (bucket: its capacity; buckets count units)
	requested int64
	retry     time.Duration // 0 when tooLarge
}

// rateHeaders are the values of the x-ratelimit-* headers.
type rateHeaders struct {
	rpm, tpm           int64
	remReqs, remToks   int64
	resetReqs, resetTk time.Duration
}

// modelState is one model's limiter and statistics within a generation.
type modelState struct {
	lim    limits
	start  int64 // generation start, unix nanoseconds
	status statusCounts
	units  *unitLimiter // nil unless the model limits units (units.go)
	day    *dayQuota    // nil unless the model has a per-day quota (day.go)

	mu              sync.Mutex
	log             chargeLog
	buckets         [2]*bucket // requests, tokens; nil unless token-bucket and limited
	timeline        []Second
	admitted        int64
	rateLimited     int64
	limitedBy       [nConstraints + 1]int64 // rejections by reason (reasonNames)
	chargedTokens   int64
	successRequests int64
	successTokens   int64
}

func newModelState(lim limits, start int64) *modelState {
	m := &modelState{lim: lim, start: start}
	if lim.bucketMS > 0 {
		m.buckets = [2]*bucket{newBucket(lim.rpm, lim.bucketMS, start), newBucket(lim.tpm, lim.bucketMS, start)}
	}
	return m
}

// statusCounts counts responses by HTTP status without locking.
type statusCounts [600]atomic.Int64

func (s *statusCounts) add(status int) {
	if status < 0 || status >= len(s) {
		status = 0
	}
	s[status].Add(1)
}

func (s *statusCounts) snapshot() map[int]int64 {
	m := map[int]int64{}
	for code := range s {
		if n := s[code].Load(); n > 0 {
			m[code] = n
		}
	}
	return m
}

// verdict is one constraint's reading at an arrival.
type verdict struct {
	used, limit int64
	fails       bool
}

// admit charges an arrival costing cost tokens at now and decides it.
func (m *modelState) admit(now, cost int64) decision {
	m.mu.Lock()
	defer m.mu.Unlock()
	now = m.log.advance(now)
	for _, b := range m.buckets {
		if b != nil {
			b.refill(now)
		}
	}
	d := decision{at: now, requested: cost}
	var pre [nConstraints]verdict
	fits := true
	for c := range nConstraints {
		pre[c] = m.check(c, cost)
		fits = fits && !pre[c].fails
	}
	d.tooLarge = m.lim.tpm > 0 && cost > m.lim.tpm
	d.admitted = fits && !d.tooLarge
	m.record(now, d.admitted, cost)
	if !d.admitted {
		m.explain(&d, now, pre)
	}
	d.rate = m.headers(now)
	return d
}

// check reads constraint c for a request costing cost. Callers hold mu,
// with the log advanced and the buckets refilled to now.
func (m *modelState) check(c constraint, cost int64) verdict {
	switch c {
	case rpmBucket, tpmBucket:
		b := m.buckets[c-rpmBucket]
		if b == nil {
			return verdict{}
		}
		return verdict{used: b.cap - b.level, limit: b.cap, fails: !b.fits(units(c.amount(cost)))}
	case rpmRamp, tpmRamp:
		if !m.lim.ramps(c) {
			return verdict{}
		}
		recent, previous := m.log.ramp()
		return verdict{
			used:  recent[c.dim()],
			limit: m.lim.rampCap(c, previous[c.dim()]),
			fails: !m.lim.rampFits(c, recent, previous, cost),
		}
	}
	used := m.log.used(m.lim.win(c))[c.dim()]
	return verdict{used: used, limit: m.lim.window(c), fails: m.lim.need(c, used, cost) > 0}
}

// record charges an arrival: a request and its tokens if admitted, only the
// request if not. Callers hold mu.
func (m *modelState) record(now int64, admitted bool, cost int64) {
	sec := m.second(now)
	if sec == nil {
		sec = &Second{} // beyond the timeline: count it nowhere
	}
	if !admitted {
		m.log.add(now, counts{dimReqs: 1})
		m.rateLimited++
		sec.RateLimited++
		return
	}
	m.log.add(now, counts{dimReqs: 1, dimAdm: 1, dimTok: cost})
	if b := m.buckets[0]; b != nil {
		b.take(units(1))
	}
	if b := m.buckets[1]; b != nil {
		b.take(units(cost))
	}
	m.admitted++
	m.chargedTokens += cost
	sec.Admitted++
	sec.ChargedTokens += cost
}

// explain fills in why a rejected arrival was rejected and when it would
// fit. pre are the constraints' readings before the rejection was charged;
// the waits are computed after it was charged, because a rejected request
// counts against RPM (and the short request windows).
//
// Windows only lose charges and buckets only fill as time passes, so each
// of them, once it fits, keeps fitting: the request fits them all after the
// longest of their waits. The ramp can close again (what leaves the
// trailing 10 s raises its cap only until it leaves the 10 s before), so
// it is searched from there.
func (m *modelState) explain(d *decision, now int64, pre [nConstraints]verdict) {
	if d.tooLarge {
		d.reason, d.used, d.limit = tpmMinute, pre[tpmMinute].used, m.lim.tpm
		m.limitedBy[reasonTooLarge]++
		return
	}
	var worst time.Duration = -1
	for c := range nConstraints {
		ramp := c == rpmRamp || c == tpmRamp
		if ramp && !pre[c].fails {
			continue // its wait matters only to name the reason
		}
		wait := m.wait(c, now, d.requested)
		if !ramp {
			d.retry = max(d.retry, wait)
		}
		if pre[c].fails && wait > worst {
			worst = wait
			d.reason, d.used, d.limit = c, pre[c].used, pre[c].limit
		}
	}
	if m.lim.growth > 0 {
		at := m.log.rampFrom(now+int64(d.retry), func(recent, previous counts) bool {
			return m.lim.rampFits(rpmRamp, recent, previous, d.requested) && m.lim.rampFits(tpmRamp, recent, previous, d.requested)
		})
		d.retry = time.Duration(at - now)
	}
	m.limitedBy[d.reason]++
}

// wait returns how long until a request costing cost fits constraint c
// alone, if nothing more is charged. Callers hold mu.
func (m *modelState) wait(c constraint, now, cost int64) time.Duration {
	switch c {
	case rpmBucket, tpmBucket:
		if b := m.buckets[c-rpmBucket]; b != nil {
			return b.wait(units(c.amount(cost)), now)
		}
		return 0
	case rpmRamp, tpmRamp:
		if !m.lim.ramps(c) {
			return 0
		}
		at := m.log.rampFrom(now, func(recent, previous counts) bool {
			return m.lim.rampFits(c, recent, previous, cost)
		})
		return time.Duration(at - now)
	}
	w := m.lim.win(c)
	wait, _ := m.log.wait(w, c.dim(), m.lim.need(c, m.log.used(w)[c.dim()], cost), now)
	return wait
}

// headers computes the x-ratelimit-* values after a charge at now: the
// 60-s window only, whatever the profile, as OpenAI's describe the minute
// and never its quantum.
func (m *modelState) headers(now int64) rateHeaders {
	u := m.log.used(winMinute)
	return rateHeaders{
		rpm:       m.lim.rpm,
		tpm:       m.lim.tpm,
		remReqs:   max(m.lim.rpm-u[dimReqs], 0),
		remToks:   max(m.lim.tpm-u[dimTok], 0),
		resetReqs: m.log.resetIn(dimReqs, now),
		resetTk:   m.log.resetIn(dimTok, now),
	}
}

// peek returns the current x-ratelimit-* values without charging anything.
func (m *modelState) peek(now int64) rateHeaders {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.headers(m.log.advance(now))
}

// succeeded records a completion of a request that arrived at at, charged
// cost and used tokens (prompt + completion).
func (m *modelState) succeeded(at, cost, tokens int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.successRequests++
	m.successTokens += tokens
	if sec := m.second(at); sec != nil {
		sec.Successes++
		sec.SuccessTokens += cost
	}
}

// maxTimeline bounds the timeline (one week of seconds).
const maxTimeline = 7 * 24 * 3600

// second returns the timeline entry for instant at, growing the timeline, or
// nil if at is beyond maxTimeline. Callers hold mu.
func (m *modelState) second(at int64) *Second {
	i := max((at-m.start)/int64(time.Second), 0)
	if i >= maxTimeline {
		return nil
	}
	if n := int64(len(m.timeline)); n <= i {
		m.timeline = append(m.timeline, make([]Second, i+1-n)...)
	}
	return &m.timeline[i]
}
