package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"
)

// Units: a model may limit units other than requests and tokens (images,
// audio seconds, tasks), per minute (ModelLimits.Units). Under every
// profile a unit is enforced as the quantized profile enforces requests and
// tokens: over a sliding 60-s window at the limit and a sliding 1-s window
// at max(ceil(limit·BurstFraction), 1), where a request alone in its second
// passes the 1-s cap. A request's amounts come from Config.UnitsOf (by
// default the body's top-level "sim_units" object, {"images": 2}); a unit
// it does not name costs DefaultUnitCost, as in Sluice. A request refused
// for a unit is answered 429 rate_limit_exceeded naming the unit, is not
// charged to RPM, and charges no unit; an admitted one charges every unit.

// UnitsField is the body field the default Config.UnitsOf reads.
const UnitsField = "sim_units"

// DefaultUnitCost is what a request costs of a unit its body does not name.
const DefaultUnitCost = 1

// bodyUnits is the default Config.UnitsOf: the body's "sim_units" object.
func bodyUnits(body []byte) map[string]int {
	var b struct {
		Units map[string]int `json:"sim_units"`
	}
	_ = json.Unmarshal(body, &b)
	return b.Units
}

// UnitStats is one unit's share of ModelStats. Window maxima are exact, as
// for requests and tokens.
type UnitStats struct {
	// Limit is the configured limit per minute; Quantum the cap of any
	// trailing second.
	Limit   int `json:"limit"`
	Quantum int `json:"quantum"`
	// Charged is what admitted requests were charged; RateLimited counts
	// the requests refused for this unit.
	Charged     int64 `json:"charged"`
	RateLimited int64 `json:"rate_limited"`
	// MaxIn60s and MaxIn1s are the most of the unit that arrived, refused
	// requests included, in any trailing (t-60s, t] and (t-1s, t];
	// MaxAdmittedIn60s and MaxAdmittedIn1s count the admitted ones only.
	MaxIn60s         int64 `json:"max_in_60s"`
	MaxIn1s          int64 `json:"max_in_1s"`
	MaxAdmittedIn60s int64 `json:"max_admitted_in_60s"`
	MaxAdmittedIn1s  int64 `json:"max_admitted_in_1s"`
}

// unitEvent is an amount charged at an instant (unix nanoseconds).
type unitEvent struct{ at, n int64 }

// unitLog keeps the events of the last minute and the most any trailing
// minute and second held.
type unitLog struct {
	events         []unitEvent
	peak60, peak1s int64
}

// sum returns what (at-w, at] holds, dropping events older than a minute.
func (l *unitLog) sum(at int64, w time.Duration) int64 {
	i := 0
	for i < len(l.events) && l.events[i].at <= at-int64(time.Minute) {
		i++
	}
	l.events = l.events[i:]
	var s int64
	for _, e := range l.events {
		if e.at > at-int64(w) {
			s += e.n
		}
	}
	return s
}

func (l *unitLog) add(at, n int64) {
	if n <= 0 {
		return
	}
	l.events = append(l.events, unitEvent{at, n})
	l.peak60 = max(l.peak60, l.sum(at, time.Minute))
	l.peak1s = max(l.peak1s, l.sum(at, time.Second))
}

// unitState is one unit of one model.
type unitState struct {
	name             string
	limit, quantum   int64
	arrived, charged unitLog
	total, refused   int64
}

// unitLimiter holds a model's units; nil when it limits none.
type unitLimiter struct {
	mu    sync.Mutex
	last  int64
	units []*unitState // sorted by name
}

func newUnitLimiter(m ModelLimits, c Config) *unitLimiter {
	if len(m.Units) == 0 {
		return nil
	}
	u := &unitLimiter{}
	for name, limit := range m.Units {
		u.units = append(u.units, &unitState{name: name, limit: int64(limit), quantum: burstCap(int64(limit), c.BurstFraction)})
	}
	sort.Slice(u.units, func(i, j int) bool { return u.units[i].name < u.units[j].name })
	return u
}

// amounts returns what a request costs of each of the limiter's units.
func (u *unitLimiter) amounts(stated map[string]int) []int64 {
	out := make([]int64, len(u.units))
	for i, us := range u.units {
		n, ok := stated[us.name]
		if !ok {
			n = DefaultUnitCost
		}
		out[i] = int64(max(n, 0))
	}
	return out
}

// admit decides an arrival on its units and then, unless they refuse it,
// on requests and tokens (m.admit), as one step under the units' lock. It
// returns the decision and, for a refusal by a unit, the error to answer.
func (s *Server) admit(m *modelState, c *call) (decision, *apiError) {
	at := c.arrived
	if at == 0 {
		at = s.now()
	}
	u := m.units
	if u == nil {
		return m.admit(at, c.cost), nil
	}
	amounts := u.amounts(s.cfg.UnitsOf(c.body))
	u.mu.Lock()
	defer u.mu.Unlock()
	now := max(at, u.last)
	u.last = now
	for i, us := range u.units {
		us.arrived.add(now, amounts[i])
	}
	for i, us := range u.units {
		n := amounts[i]
		if us.limit <= 0 || n == 0 {
			continue
		}
		minute, second := us.charged.sum(now, time.Minute), us.charged.sum(now, time.Second)
		var retry time.Duration
		switch {
		case n > us.limit:
			retry = -1
		case minute+n > us.limit:
			retry = us.charged.waitFor(now, time.Minute, minute+n-us.limit)
		case second > 0 && second+n > us.quantum:
			retry = us.charged.waitFor(now, time.Second, min(second+n-us.quantum, second))
		default:
			continue
		}
		us.refused++
		m.refusedBeyondWindows(now)
		e := &apiError{Type: us.name, Code: "rate_limit_exceeded"}
		d := decision{at: now, rate: m.peek(now), retry: max(retry, 0)}
		switch {
		case retry < 0:
			d.tooLarge = true
			e.Message = fmt.Sprintf("Request too large for %s in organization %s on %s per min: Limit %d, Requested %d.", c.model, organization, us.name, us.limit, n)
		case s.cfg.Profile == ProfileHidden:
			e.Message = "Rate limit reached. Please try again later."
		default:
			e.Message = fmt.Sprintf("Rate limit reached for %s in organization %s on %s per min: Limit %d (%d per second), Used %d in the minute and %d in the second, Requested %d. Please try again in %s.",
				c.model, organization, us.name, us.limit, us.quantum, minute, second, n, formatDuration(max(retry, time.Millisecond)))
		}
		return d, e
	}
	d := m.admit(now, c.cost)
	if d.admitted {
		for i, us := range u.units {
			us.charged.add(now, amounts[i])
			us.total += amounts[i]
		}
	}
	return d, nil
}

// waitFor returns how long until need of what (at-w, at] holds has left
// it.
func (l *unitLog) waitFor(at int64, w time.Duration, need int64) time.Duration {
	var freed int64
	for _, e := range l.events {
		if e.at <= at-int64(w) {
			continue
		}
		freed += e.n
		if freed >= need {
			return time.Duration(e.at + int64(w) - at + 1)
		}
	}
	return w
}

// refusedBeyondWindows counts a refusal by a unit or a per-day quota with
// the model's rate-limited arrivals.
func (m *modelState) refusedBeyondWindows(now int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rateLimited++
	if sec := m.second(now); sec != nil {
		sec.RateLimited++
	}
}

// snapshot copies the units' statistics.
func (u *unitLimiter) snapshot() map[string]UnitStats {
	if u == nil {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make(map[string]UnitStats, len(u.units))
	for _, us := range u.units {
		out[us.name] = UnitStats{Limit: int(us.limit), Quantum: int(us.quantum), Charged: us.total, RateLimited: us.refused,
			MaxIn60s: us.arrived.peak60, MaxIn1s: us.arrived.peak1s, MaxAdmittedIn60s: us.charged.peak60, MaxAdmittedIn1s: us.charged.peak1s}
	}
	return out
}

// failUnit answers a request a unit refused.
func (s *Server) failUnit(w http.ResponseWriter, g *generation, m *modelState, d decision, e *apiError) {
	if !d.tooLarge {
		setRetryAfter(w.Header(), d.retry)
	}
	s.fail(w, g, m, http.StatusTooManyRequests, *e)
}
