package sim

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// dayMinutes is the per-day quota's window in one-minute buckets.
const dayMinutes = 24 * 60

// dayLimitNames name a per-day refusal in ModelStats.RateLimitedBy and
// Arrival.Limit, by dimension.
var dayLimitNames = [2]string{"requests_per_day", "tokens_per_day"}

// dayQuota is a model's per-day quota (ModelLimits.RPD, TPD): the requests
// and tokens admitted in the trailing 24 h, counted in one-minute buckets.
// A request is judged against it before the model's rate limits, and
// charged once they admit it, all under mu (Server.execute).
type dayQuota struct {
	rpd, tpd int64
	mu       sync.Mutex
	minute   [dayMinutes]int64 // the unix minute each bucket holds
	reqs     [dayMinutes]int64
	toks     [dayMinutes]int64
	// refused counts refusals by dimension (requests, tokens); atomic, as
	// Stats reads it holding the model's lock, which execute takes
	// after mu.
	refused [2]atomic.Int64
}

func newDayQuota(m ModelLimits) *dayQuota {
	if m.RPD <= 0 && m.TPD <= 0 {
		return nil
	}
	return &dayQuota{rpd: int64(m.RPD), tpd: int64(m.TPD)}
}

// used sums the trailing 24 h at unix minute now. Callers hold mu.
func (q *dayQuota) used(now int64) (reqs, toks int64) {
	for i := range q.minute {
		if q.minute[i] > now-dayMinutes && q.minute[i] <= now {
			reqs += q.reqs[i]
			toks += q.toks[i]
		}
	}
	return reqs, toks
}

// nextFree is how long after unix nanoseconds at the trailing 24 h has
// room for cost in the dimension that refused (0: requests, 1: tokens).
// Callers hold mu.
func (q *dayQuota) nextFree(at int64, dim int, cost int64) time.Duration {
	now := at / int64(time.Minute)
	reqs, toks := q.used(now)
	over := reqs + 1 - q.rpd
	if dim == 1 {
		over = toks + cost - q.tpd
	}
	for m := now - dayMinutes + 1; m <= now; m++ {
		i := m % dayMinutes
		if q.minute[i] != m {
			continue
		}
		if dim == 0 {
			over -= q.reqs[i]
		} else {
			over -= q.toks[i]
		}
		if over <= 0 {
			return time.Duration((m+dayMinutes)*int64(time.Minute) - at)
		}
	}
	return 24 * time.Hour
}

// check judges a request costing cost at unix nanoseconds at: ok, or the
// dimension that refuses it (0: requests, 1: tokens), its limit, what the
// trailing 24 h holds and how long until it has room. Callers hold mu,
// and charge an admitted request before they release it.
func (q *dayQuota) check(at, cost int64) (ok bool, dim int, limit, used int64, wait time.Duration) {
	reqs, toks := q.used(at / int64(time.Minute))
	switch {
	case q.rpd > 0 && reqs+1 > q.rpd:
		dim, limit, used = 0, q.rpd, reqs
	case q.tpd > 0 && toks+cost > q.tpd:
		dim, limit, used = 1, q.tpd, toks
	default:
		return true, 0, 0, 0, 0
	}
	q.refused[dim].Add(1)
	return false, dim, limit, used, q.nextFree(at, dim, cost)
}

// charge counts an admitted request. Callers hold mu.
func (q *dayQuota) charge(at, cost int64) {
	now := at / int64(time.Minute)
	i := now % dayMinutes
	if q.minute[i] != now {
		q.minute[i], q.reqs[i], q.toks[i] = now, 0, 0
	}
	q.reqs[i]++
	q.toks[i] += cost
}

// dayError is the refusal of a request over a per-day quota, in OpenAI's
// words for it ("... on requests per day (RPD): Limit 200, Used 200,
// Requested 1. Please try again in 7h12m0s."): no retry within minutes
// helps, which is how a client should read it.
func dayError(model string, dim int, limit, used, requested int64, wait time.Duration) apiError {
	name, abbr := "requests", "RPD"
	if dim == 1 {
		name, abbr = "tokens", "TPD"
	}
	return apiError{Type: name, Code: "rate_limit_exceeded", Message: fmt.Sprintf(
		"Rate limit reached for %s in organization %s on %s per day (%s): Limit %d, Used %d, Requested %d. Please try again in %s.",
		model, organization, name, abbr, limit, used, requested, formatDuration(max(wait, time.Millisecond)))}
}

// refuseDay answers a request over its model's per-day quota.
func (s *Server) refuseDay(w http.ResponseWriter, g *generation, m *modelState, c *call, dim int, limit, used int64, wait time.Duration) {
	requested := int64(1)
	if dim == 1 {
		requested = c.cost
	}
	setRetryAfter(w.Header(), wait)
	s.fail(w, g, m, http.StatusTooManyRequests, dayError(c.model, dim, limit, used, requested, wait))
}
