package admission

import (
	"math"
	"slices"

	"github.com/sluice-dev/sluice/internal/budget"
)

// # What a tenant's turn is charged
//
// The fair queues share a model's minute, so a job is charged its share of
// that minute in the dimension that binds it: the largest of its requests,
// tokens, output tokens and units each over the model's per-minute limit
// for it. The share is counted in token-equivalents (a share of the token
// limit: a job's charge is its tokens whenever tokens bind it), so the
// quantum keeps its meaning. On a model with rpm 60 and tpm 1,000,000 a
// 20-token job is charged a request's worth, 16,667, not 20: 40 small jobs
// are 40 requests, two-thirds of the minute, not 800 tokens. A model with
// no token limit counts a request as one quantum; one with neither a token
// nor a request limit charges tokens. Limits are the configured ones of the
// queue's deployments together (a dimension any of them leaves unlimited
// binds none); only their ratios matter.

// fairMinute is what a fair queue's deployments allow in a minute, in each
// dimension they all limit (0: unlimited), and the token-equivalents that
// minute is worth (0: jobs are charged their tokens).
type fairMinute struct {
	requests, tokens, output int
	units                    [budget.MaxUnits]int // by the first deployment's unit index (costOf)
	scale                    int64
}

// fairMinuteOf sums the configured minutes of deps; quantum is
// admission.quantum, what a request is worth on a model with no token limit.
func (h *holder) fairMinuteOf(deps []*modelState, quantum int) fairMinute {
	var f fairMinute
	for k, ms := range deps {
		_, m, ok := h.app().Deployment(ms.provider, ms.model)
		if !ok {
			return fairMinute{} // charged by tokens, as before the model was known
		}
		f.requests = addLimit(f.requests, m.RPM, k)
		f.tokens = addLimit(f.tokens, m.TokenLimit(), k)
		f.output = addLimit(f.output, m.OTPM, k)
		for i, name := range deps[0].units {
			lim := 0
			if j := slices.Index(ms.units, name); j >= 0 {
				lim = ms.unitLimits[j]
			}
			f.units[i] = addLimit(f.units[i], lim, k)
		}
	}
	switch {
	case f.tokens > 0:
		f.scale = int64(f.tokens)
	case f.requests > 0:
		f.scale = int64(f.requests) * int64(quantum)
	}
	return f
}

// addLimit adds the k-th deployment's limit to a group's sum: unlimited
// (0) when any deployment leaves the dimension unlimited.
func addLimit(sum, limit, k int) int {
	if limit <= 0 || (k > 0 && sum == 0) {
		return 0
	}
	return sum + limit
}

// charge is what a job costing c pays from its tenant's deficit: its
// largest share of the minute, in token-equivalents.
func (f fairMinute) charge(c budget.Cost) int {
	if f.scale == 0 {
		return c.Tokens
	}
	ch := f.share(c.Requests, f.requests)
	ch = max(ch, f.share(c.Tokens, f.tokens), f.share(c.Output, f.output))
	for i, lim := range f.units {
		ch = max(ch, f.share(c.Units[i], lim))
	}
	return ch
}

// share is used over limit of the minute in token-equivalents, rounded up
// (0 when the dimension is unlimited).
func (f fairMinute) share(used, limit int) int {
	if used <= 0 || limit <= 0 {
		return 0
	}
	v := (int64(used)*f.scale + int64(limit) - 1) / int64(limit)
	return int(min(v, math.MaxInt32))
}

// quantum is what a tenant of weight 1 earns per round: admission.quantum,
// or more, so that one quantum pays for a request and for one of each unit
// the model limits (a new flow's first small job goes first, and a round
// serves at least a job of the size most jobs have).
func (f fairMinute) quantum(q int) int {
	q = max(q, f.share(1, f.requests))
	for _, lim := range f.units {
		q = max(q, f.share(1, lim))
	}
	return q
}
