// Package breaker is a circuit breaker per provider/model: when a target
// keeps failing, calls to it stop for a while instead of piling more load on
// a struggling provider, then a few probe calls test whether it recovered.
//
// A Breaker is pure state: it starts no goroutine, takes its clock from
// [Config.Now], and is safe for concurrent use.
//
// # What counts as a failure
//
// The caller decides, and reports only what speaks of the provider's health:
//
//   - success: a 2xx answer.
//   - failure: overload and 5xx (provider.Overloaded), a connection that
//     could not be made (provider.ConnectFailed), and an attempt whose
//     outcome is unknown (provider.Unknown: no headers, body cut).
//   - neither (call [Breaker.Release]): 4xx request errors (provider.Fail),
//     429 rate limits (provider.Retry), 401/403 (provider.AuthBroken) and
//     quota or billing (provider.OperatorAction). They say the request,
//     the rate or the account is wrong, not that the provider is unhealthy;
//     a breaker that opened on 429s would turn throttling into an outage.
//     A call abandoned before it was made (job expired, shutdown) is also
//     released.
//
// Every Allow that returns ok must be followed by exactly one Record or
// Release with the probe flag Allow returned; otherwise a half-open breaker
// keeps its probe slots taken and never closes. [Breaker.Take] returns a
// [Ticket] that keeps that count: defer its Release, and Record the outcome.
//
// # States
//
// Closed admits every call and counts outcomes in a rolling window. When the
// window holds at least MinRequests outcomes and the failure rate reaches
// FailureRate, the breaker opens: it refuses calls for OpenFor, then turns
// half-open and admits up to Probes concurrent probe calls. Probes successes
// close it; one failed probe opens it again for twice as long (up to
// MaxOpenFor). Closing resets the open period and starts an empty window.
package breaker

import (
	"maps"
	"strconv"
	"sync"
	"time"
)

// Defaults for zero Config fields.
const (
	DefaultWindow      = 30 * time.Second
	DefaultMinRequests = 20
	DefaultFailureRate = 0.5
	DefaultOpenFor     = 15 * time.Second
	DefaultMaxOpenFor  = 2 * time.Minute
	DefaultProbes      = 3
)

// buckets is how many slices the rolling window is cut into. Outcomes leave
// the window one bucket at a time, so an outcome older than Window never
// counts and one younger than Window*(buckets-1)/buckets always does
// (with the default 30s window: 1s buckets).
const buckets = 30

// Config tunes a Breaker. Zero or out-of-range fields take the defaults.
type Config struct {
	// Window is the rolling window the failure rate is computed over.
	Window time.Duration
	// MinRequests: the breaker never opens while the window holds fewer
	// outcomes than this.
	MinRequests int
	// FailureRate in (0, 1]: open when failures/total >= FailureRate.
	FailureRate float64
	// OpenFor is how long the breaker stays open before half-open. Each
	// failed probe doubles it, up to MaxOpenFor (at least OpenFor).
	OpenFor    time.Duration
	MaxOpenFor time.Duration
	// Probes is how many probe successes close a half-open breaker, and how
	// many probe calls it admits at once.
	Probes int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.MinRequests <= 0 {
		c.MinRequests = DefaultMinRequests
	}
	if !(c.FailureRate > 0 && c.FailureRate <= 1) { // also catches NaN
		c.FailureRate = DefaultFailureRate
	}
	if c.OpenFor <= 0 {
		c.OpenFor = DefaultOpenFor
	}
	if c.MaxOpenFor <= 0 {
		c.MaxOpenFor = DefaultMaxOpenFor
	}
	c.MaxOpenFor = max(c.MaxOpenFor, c.OpenFor)
	if c.Probes <= 0 {
		c.Probes = DefaultProbes
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// State is a breaker's state.
type State int

const (
	Closed State = iota
	Open
	HalfOpen
)

// States lists every state, e.g. to pre-register metric label values.
var States = []State{Closed, Open, HalfOpen}

// String returns the state's stable name, usable as a metric label value.
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "state_" + strconv.Itoa(int(s))
}

type bucket struct {
	slot      int64 // which bucket-wide slice of time the counts belong to
	successes int
	failures  int
}

// Breaker is one circuit breaker. The zero value is not usable; call New.
type Breaker struct {
	cfg   Config
	width time.Duration // of one bucket
	epoch time.Time     // slots count bucket widths from here

	mu        sync.Mutex
	state     State
	window    [buckets]bucket
	openFor   time.Duration // the current open period
	openUntil time.Time     // when Open turns HalfOpen
	inFlight  int           // probes admitted and not yet recorded or released
	passed    int           // probe successes in this half-open period
}

// New returns a closed breaker.
func New(cfg Config) *Breaker {
	cfg = cfg.withDefaults()
	return &Breaker{
		cfg:     cfg,
		width:   max(cfg.Window/buckets, 1),
		epoch:   cfg.Now(),
		openFor: cfg.OpenFor,
	}
}

// Allow asks whether a call may start now.
//
// Closed: ok. Open: not ok, and retryAt is when the breaker turns half-open.
// Half-open: ok with probe set while fewer than Probes probes are in flight;
// otherwise not ok, with retryAt one OpenFor from now (the probes in flight
// decide the state; that is a fair time to ask again).
func (b *Breaker) Allow() (ok, probe bool, retryAt time.Time) {
	now := b.cfg.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	switch b.state {
	case Open:
		return false, false, b.openUntil
	case HalfOpen:
		if b.inFlight < b.cfg.Probes {
			b.inFlight++
			return true, true, time.Time{}
		}
		return false, false, now.Add(b.cfg.OpenFor)
	}
	return true, false, time.Time{}
}

// Record reports the outcome of a call Allow admitted; probe is what Allow
// returned. See the package documentation for what is a failure.
//
// Outcomes of ordinary calls count in the closed state's window and are
// ignored otherwise (a call admitted before the breaker opened says nothing
// new). A probe outcome that arrives after its half-open period ended counts
// as an ordinary outcome.
func (b *Breaker) Record(success, probe bool) {
	now := b.cfg.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	switch b.state {
	case Closed:
		b.count(now, success)
		if !success && b.tripped(now) {
			b.open(now, b.cfg.OpenFor)
		}
	case HalfOpen:
		if !probe {
			return
		}
		b.inFlight = max(b.inFlight-1, 0)
		if !success {
			b.open(now, min(2*b.openFor, b.cfg.MaxOpenFor))
			return
		}
		b.passed++
		if b.passed >= b.cfg.Probes {
			b.close()
		}
	}
}

// Release ends a call Allow admitted without counting an outcome: the call
// was not made, or its answer says nothing about the provider's health (a
// 4xx, a 429). A released probe frees its slot for another probe.
func (b *Breaker) Release(probe bool) {
	now := b.cfg.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	if probe && b.state == HalfOpen {
		b.inFlight = max(b.inFlight-1, 0)
	}
}

// Ticket is a call Allow admitted, settled exactly once: by Record, or by
// Release, which a caller defers right after Take so that every way out of
// the call (an abandoned call, a shutdown, an early return added later)
// gives a half-open breaker's probe slot back. Settling a ticket again does
// nothing: a second Release must not free a slot another probe holds.
type Ticket struct {
	b       *Breaker
	probe   bool
	settled bool
}

// Take is Allow returning a Ticket (nil when the call is refused).
func (b *Breaker) Take() (t *Ticket, retryAt time.Time) {
	ok, probe, retryAt := b.Allow()
	if !ok {
		return nil, retryAt
	}
	return &Ticket{b: b, probe: probe}, time.Time{}
}

// Record settles the ticket with the call's outcome (Breaker.Record).
func (t *Ticket) Record(success bool) {
	if t == nil || t.settled {
		return
	}
	t.settled = true
	t.b.Record(success, t.probe)
}

// Release settles the ticket without an outcome (Breaker.Release).
func (t *Ticket) Release() {
	if t == nil || t.settled {
		return
	}
	t.settled = true
	t.b.Release(t.probe)
}

// Probe reports whether the ticket is a half-open breaker's probe.
func (t *Ticket) Probe() bool { return t != nil && t.probe }

// State returns the current state.
func (b *Breaker) State() State {
	now := b.cfg.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	return b.state
}

// advance turns Open into HalfOpen once the open period is over.
func (b *Breaker) advance(now time.Time) {
	if b.state == Open && !now.Before(b.openUntil) {
		b.state, b.inFlight, b.passed = HalfOpen, 0, 0
	}
}

func (b *Breaker) open(now time.Time, d time.Duration) {
	b.state, b.openFor, b.openUntil = Open, d, now.Add(d)
	b.inFlight, b.passed = 0, 0
	b.window = [buckets]bucket{}
}

func (b *Breaker) close() {
	b.state, b.openFor, b.openUntil = Closed, b.cfg.OpenFor, time.Time{}
	b.inFlight, b.passed = 0, 0
	b.window = [buckets]bucket{}
}

// slot numbers the bucket-wide slice of time now falls in. A clock that
// steps back at worst drops outcomes from the window early.
func (b *Breaker) slot(now time.Time) int64 {
	d := now.Sub(b.epoch)
	s := int64(d / b.width)
	if d < 0 && d%b.width != 0 {
		s-- // floor, not truncation toward zero
	}
	return s
}

func (b *Breaker) count(now time.Time, success bool) {
	s := b.slot(now)
	bk := &b.window[((s%buckets)+buckets)%buckets]
	if bk.slot != s {
		*bk = bucket{slot: s}
	}
	if success {
		bk.successes++
	} else {
		bk.failures++
	}
}

// tripped reports whether the window's outcomes call for opening.
func (b *Breaker) tripped(now time.Time) bool {
	cur := b.slot(now)
	var ok, failed int
	for _, bk := range b.window {
		if bk.slot <= cur && bk.slot > cur-buckets {
			ok += bk.successes
			failed += bk.failures
		}
	}
	total := ok + failed
	return total >= b.cfg.MinRequests && float64(failed) >= b.cfg.FailureRate*float64(total)
}

// Set holds one breaker per key, made on first use with the same Config.
// Keys are "provider/model" (config.Target.String); they should come from
// configuration, never from requests, so the set stays bounded.
type Set struct {
	cfg Config

	mu       sync.Mutex
	breakers map[string]*Breaker
}

// NewSet returns an empty set whose breakers use cfg.
func NewSet(cfg Config) *Set {
	return &Set{cfg: cfg, breakers: map[string]*Breaker{}}
}

// Get returns key's breaker, creating it closed on first use.
func (s *Set) Get(key string) *Breaker {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.breakers[key]
	if !ok {
		b = New(s.cfg)
		s.breakers[key] = b
	}
	return b
}

// States returns every breaker's current state, e.g. for a gauge.
func (s *Set) States() map[string]State {
	s.mu.Lock()
	bs := maps.Clone(s.breakers)
	s.mu.Unlock()
	out := make(map[string]State, len(bs))
	for k, b := range bs {
		out[k] = b.State()
	}
	return out
}
