package sim

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// limits are one model's configured limits; zero means unlimited.
type limits struct {
	rpm, tpm             int64
	burstReqs, burstToks int64 // per-second caps
}

func newLimits(m ModelLimits, burstFraction float64) limits {
	return limits{
		rpm:       int64(m.RPM),
		tpm:       int64(m.TPM),
		burstReqs: burstCap(m.RPM, burstFraction),
		burstToks: burstCap(m.TPM, burstFraction),
	}
}

// burstCap is max(ceil(limit·fraction), 1), or 0 (unlimited) for limit 0. A
// hair is taken off before rounding up so that 600·0.1 is 60, not 61.
func burstCap(limit int, fraction float64) int64 {
	if limit == 0 {
		return 0
	}
	return max(int64(math.Ceil(float64(limit)*fraction-1e-9)), 1)
}

// constraint is one of the four limits a request must fit.
type constraint int

const (
	rpmMinute constraint = iota
	rpmSecond
	tpmMinute
	tpmSecond
	nConstraints
)

func (c constraint) win() win {
	if c == rpmMinute || c == tpmMinute {
		return winMinute
	}
	return winSecond
}

func (c constraint) dim() dim {
	if c == rpmMinute || c == rpmSecond {
		return dimReqs
	}
	return dimTok
}

// kind is OpenAI's error type for the constraint: "requests" or "tokens".
func (c constraint) kind() string {
	if c.dim() == dimTok {
		return "tokens"
	}
	return "requests"
}

// describe names the constraint the way OpenAI's messages do.
func (c constraint) describe() string {
	switch c {
	case rpmMinute:
		return "requests per min (RPM)"
	case rpmSecond:
		return "requests per second burst (RPM burst cap)"
	case tpmMinute:
		return "tokens per min (TPM)"
	default:
		return "tokens per second burst (TPM burst cap)"
	}
}

func (l limits) limit(c constraint) int64 {
	return [nConstraints]int64{l.rpm, l.burstReqs, l.tpm, l.burstToks}[c]
}

// need returns how much of c's dimension must leave c's window (which holds
// used) before a request costing cost tokens fits; <= 0 means it fits now.
func (l limits) need(c constraint, used, cost int64) int64 {
	lim := l.limit(c)
	if lim == 0 {
		return 0
	}
	req := int64(1)
	if c.dim() == dimTok {
		req = cost
	}
	n := used + req - lim
	if c == tpmSecond {
		n = min(n, used) // a request alone in its second passes the burst cap
	}
	return n
}

// decision is the outcome of one arrival.
type decision struct {
	admitted bool
	at       int64 // arrival instant, unix nanoseconds
	rate     rateHeaders

	// Set when rejected.
	tooLarge  bool // cost exceeds TPM: it can never run
	reason    constraint
	used      int64 // what reason's window held before the arrival
	limit     int64
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

	mu              sync.Mutex
	log             chargeLog
	timeline        []Second
	admitted        int64
	rateLimited     int64
	chargedTokens   int64
	successRequests int64
	successTokens   int64
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

// admit charges an arrival costing cost tokens at now and decides it.
func (m *modelState) admit(now, cost int64) decision {
	m.mu.Lock()
	defer m.mu.Unlock()
	now = m.log.advance(now)
	d := decision{at: now, requested: cost}
	used := m.used()
	var pre [nConstraints]int64
	fits := true
	for c := range nConstraints {
		pre[c] = m.lim.need(c, used[c], cost)
		fits = fits && pre[c] <= 0
	}
	d.tooLarge = m.lim.tpm > 0 && cost > m.lim.tpm
	d.admitted = fits && !d.tooLarge
	m.record(now, d.admitted, cost)
	if !d.admitted {
		m.explain(&d, now, pre, used)
	}
	d.rate = m.headers(now)
	return d
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
	m.admitted++
	m.chargedTokens += cost
	sec.Admitted++
	sec.ChargedTokens += cost
}

// used returns what each constraint's window holds. Callers hold mu.
func (m *modelState) used() [nConstraints]int64 {
	var u [nConstraints]int64
	for c := range nConstraints {
		u[c] = m.log.used(c.win())[c.dim()]
	}
	return u
}

// explain fills in why a rejected arrival was rejected and when it would
// fit. pre are the constraints' needs before the rejection was charged and
// used what their windows held then; the wait is computed after it was
// charged, because a rejected request counts against RPM.
func (m *modelState) explain(d *decision, now int64, pre, used [nConstraints]int64) {
	if d.tooLarge {
		d.reason, d.used, d.limit = tpmMinute, used[tpmMinute], m.lim.tpm
		return
	}
	var worst time.Duration = -1
	after := m.used()
	for c := range nConstraints {
		need := m.lim.need(c, after[c], d.requested)
		wait, _ := m.log.wait(c.win(), c.dim(), need, now)
		d.retry = max(d.retry, wait)
		if pre[c] > 0 && wait > worst {
			worst = wait
			d.reason, d.used, d.limit = c, used[c], m.lim.limit(c)
		}
	}
}

// headers computes the x-ratelimit-* values after a charge at now.
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
