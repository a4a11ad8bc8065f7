package budget

import (
	"math"
	"slices"
	"sync"
	"time"
)

// # The send lead
//
// A paced call's instant is planned some lead ahead of now, so that the job
// can cross DISPATCH and its executor can get ready (verify it, take a
// slot, mark the operation in flight) before the instant comes. A call is
// never sent outside [instant, instant+tolerance] whatever the lead (the
// executor checks), so the lead does not bear on the limits; but a call
// whose transit runs past the lead is late by the excess, which uses up
// tolerance the transit to the provider needs, and one later than the
// tolerance lapses (planned again); a lead longer than the transit adds
// its excess to the call's latency. So the lead is learned from the
// transits executors report (plan to ready, deliberate waits taken out):
// long enough that the typical call is on time (a quantile plus a margin)
// and the slowest are late by at most Late, within [Min, Max], and Max (the
// configured send_lead) until enough transits are known.

// LeadEstimator learns the send lead from observed dispatch transits. It
// is safe for concurrent use; fill the fields, then call Observe and Lead.
type LeadEstimator struct {
	// Min and Max bound the lead; Max is also the lead before MinSamples
	// transits are known.
	Min, Max time.Duration
	// Quantile of the transits that are on time, with Margin added (a
	// transit is measured, not known).
	Quantile float64
	Margin   time.Duration
	// Tail of the transits (a quantile) that are late by at most Late.
	Tail float64
	Late time.Duration
	// Samples is how many recent transits are kept; MinSamples how many
	// are needed before they are trusted. Window: transits older than this
	// are forgotten (0: none are).
	Samples, MinSamples int
	Window              time.Duration
	// Untrusted is the lead before MinSamples transits are known (0: Max).
	Untrusted time.Duration

	mu   sync.Mutex
	ring []transit
	next int
}

type transit struct {
	at time.Time
	d  time.Duration
}

// NewLeadEstimator returns an estimator bounded by [min, max], that lets
// the slowest calls be late by at most late, with the defaults: the median
// of the last 128 transits (of the last 10 minutes) on time with 0.5 ms to
// spare, 0.99 of them late by at most late, trusted from 16 transits on.
// A burst of slow transits (a cold start, a pause) passes after 128 calls.
func NewLeadEstimator(min, max, late time.Duration) *LeadEstimator {
	return &LeadEstimator{Min: min, Max: max, Quantile: 0.5, Margin: 500 * time.Microsecond, Tail: 0.99, Late: late,
		Samples: 128, MinSamples: 16, Window: 10 * time.Minute}
}

// Observe records one transit measured at now. A negative one (clocks
// apart) counts as 0.
func (e *LeadEstimator) Observe(now time.Time, d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := max(e.Samples, 1)
	t := transit{at: now, d: max(d, 0)}
	if len(e.ring) < n {
		e.ring = append(e.ring, t)
		return
	}
	e.ring[e.next%n] = t
	e.next = (e.next + 1) % n
}

// Lead returns the lead to plan with at now.
func (e *LeadEstimator) Lead(now time.Time) time.Duration {
	e.mu.Lock()
	ds := make([]time.Duration, 0, len(e.ring))
	for _, t := range e.ring {
		if e.Window <= 0 || now.Sub(t.at) <= e.Window {
			ds = append(ds, t.d)
		}
	}
	e.mu.Unlock()
	if len(ds) == 0 || len(ds) < e.MinSamples {
		if e.Untrusted > 0 {
			return e.Untrusted
		}
		return e.Max
	}
	slices.Sort(ds)
	l := max(quantile(ds, e.Quantile)+e.Margin, quantile(ds, e.Tail)-e.Late)
	return min(max(l, e.Min), e.Max)
}

// quantile is the smallest of the sorted ds that at least a share q of
// them do not exceed.
func quantile(ds []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}
