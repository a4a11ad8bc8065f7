package budget

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// The ledger: this file owns what a model's schedule is charged for one
// job, from its placement to its settlement. Admission reserves
// (Rule.Claim, Rule.Place, Rule.Reserve), the guard bounds a reservation
// (Rule.Check), the executor settles it (Ledger.Settle) or gives it back
// (Ledger.GiveBack); none of them does the arithmetic itself.
//
// A reservation holds its parts apart (Held): the slice it was made in, the
// prompt as placed (Sluice's estimate at the fleet's correction), the part
// of that prompt expected from the provider's cache, the output (the
// request's max tokens) and its units. The provider kind's Rule says how
// the parts are counted on the schedule's dimensions:
//
//   - one token limit (OpenAI and the like): tokens = prompt + output,
//     charged at arrival; the prompt is settled to the provider's count,
//     the output is not (the provider charged max tokens at arrival);
//   - input and output apart (Anthropic: ITPM, OTPM): tokens = the input,
//     less the cache reads unless the model's cache reads count; output =
//     the output; both settled to the counts reported, and what goes back
//     rewinds the pace (the provider refills a bucket).
//
// A reservation also states its totals on those dimensions (Tokens,
// Output, Cached), signed by admission, and its ID "<slice>-0": the
// executors from before Slice and Prompt read those. One made before them
// (no Slice) is read the old way, here only (Rule.Held).

// Rule is how a model's calls count against its limits: its provider
// kind's accounting rule and what of the model's configuration the
// ledger needs. config.Model.Rule makes it; nothing else chooses it.
type Rule struct {
	// Split: input and output tokens are limited apart (Anthropic).
	Split bool
	// CacheReads: cache reads count toward the input limit (Split only;
	// the model's cache_reads_count).
	CacheReads bool
	// Refill is the configured limits a split model's bucket refills at:
	// what goes back rewinds the pace at them.
	Refill Limits
	// Units are the model's units, in the budgets' index order.
	Units []string
}

// CacheFree reports whether prompt tokens read from the provider's cache
// cost nothing on the schedule (and so a warm prefix is not reserved).
func (r Rule) CacheFree() bool { return r.Split && !r.CacheReads }

// Held is a reservation's parts, in the ledger's units.
type Held struct {
	Slice    int64 // the slice the reservation was made in: what a settlement charges
	Requests int
	Prompt   int // prompt (input) tokens as placed, the cached part included
	Cached   int // of Prompt, expected from the provider's cache and not held
	Output   int // output tokens held
	Units    [MaxUnits]int
}

// Cost is what h holds on the schedule, by the rule.
func (r Rule) Cost(h Held) Cost {
	c := Cost{Requests: h.Requests, Units: h.Units}
	if r.Split {
		c.Tokens, c.Output = h.Prompt, h.Output
	} else {
		c.Tokens = h.Prompt + h.Output
	}
	if r.CacheFree() {
		c.Tokens -= h.Cached
	}
	return c
}

// Claim is what a job's estimate asks of the schedule: one request, its
// prompt and output estimates, and its estimate of each unit.
func (r Rule) Claim(e *job.Estimate) Held {
	h := Held{Requests: 1, Prompt: e.PromptTokens, Output: e.MaxTokens}
	for i, name := range r.Units {
		h.Units[i] = e.Units[name]
	}
	return h
}

// Place sets h's prompt to placed (the estimate at the fleet's correction),
// so that h never holds more tokens than limit, a model's minute (0: no
// limit), or the estimate asked, whichever is larger: more could never be
// placed.
func (r Rule) Place(h Held, placed, limit int) Held {
	whole := r.Cost(h).Tokens
	h.Prompt = placed
	if limit > 0 {
		if over := r.Cost(h).Tokens - max(limit, whole); over > 0 {
			h.Prompt -= over
		}
	}
	return h
}

// Reserve is the reservation of h (admission sets its times). Tokens,
// Output and Cached are what executors older than Slice and Prompt read.
func (r Rule) Reserve(h Held) *task.Reservation {
	c := r.Cost(h)
	res := &task.Reservation{ID: reservationID(h.Slice), Slice: h.Slice, Prompt: h.Prompt,
		Requests: c.Requests, Tokens: c.Tokens, Output: c.Output, Cached: h.Cached}
	if len(r.Units) > 0 {
		res.Units = make(map[string]int, len(r.Units))
		for i, name := range r.Units {
			res.Units[name] = h.Units[i]
		}
	}
	return res
}

// reservationID names a reservation made in slice (the executors before
// Reservation.Slice read the slice from it).
func reservationID(slice int64) string { return strconv.FormatInt(slice, 10) + "-0" }

// Held is j's reservation's parts. A reservation made before it carried
// Slice and Prompt (a rolling upgrade) has them read the old way: the
// slice from its ID, the prompt from its tokens by the rule.
func (r Rule) Held(j *task.Task) Held {
	res := j.Reservation
	h := Held{Slice: res.Slice, Requests: res.Requests, Prompt: res.Prompt, Cached: res.Cached, Output: res.Output}
	for i, name := range r.Units {
		h.Units[i] = res.Units[name]
	}
	if res.Slice == 0 {
		h.Slice, _ = legacySlice(res.ID)
		h.Prompt = r.legacyPrompt(j)
	}
	if !r.Split && j.Estimate != nil {
		h.Output = j.Estimate.MaxTokens // held in Tokens, beside the prompt
	}
	return h
}

// legacySlice reads the slice out of a reservation ID made before
// Reservation.Slice ("<slice>-<n>").
func legacySlice(id string) (int64, bool) {
	n, _, ok := strings.Cut(id, "-")
	if !ok {
		return 0, false
	}
	k, err := strconv.ParseInt(n, 10, 64)
	return k, err == nil
}

// legacyPrompt is the prompt a reservation without Prompt holds.
func (r Rule) legacyPrompt(j *task.Task) int {
	res := j.Reservation
	if r.Split {
		return res.Tokens + res.Cached
	}
	if j.Estimate == nil {
		return res.Tokens
	}
	if res.Tokens >= j.Estimate.MaxTokens {
		return res.Tokens - j.Estimate.MaxTokens
	}
	return j.Estimate.PromptTokens
}

// Check reports why j's reservation is out of the bounds its estimate
// allows ("" when within): prompt within [lo, hi] (what placing the
// estimate at any correction can make of it), the cached part within the
// prompt, the output at least the estimate's, one request at least, and
// the totals it states (Tokens, Output) the rule's count of its parts.
func (r Rule) Check(j *task.Task, lo, hi int) string {
	res, e := j.Reservation, j.Estimate
	h := r.Held(j)
	c := r.Cost(h)
	switch {
	case h.Requests < 1:
		return "requests"
	case h.Prompt < lo || h.Prompt > hi:
		return fmt.Sprintf("prompt %d outside [%d, %d]", h.Prompt, lo, hi)
	case h.Cached < 0 || h.Cached > h.Prompt:
		return "cached"
	case h.Output < e.MaxTokens || res.Output < 0:
		return "output"
	case c.Tokens != res.Tokens || c.Output != res.Output:
		return "totals"
	case res.ID != reservationID(h.Slice):
		return "slice"
	}
	return ""
}

// Settlement is what a call's usage u changes in what j's reservation
// held, by the rule: extra is charged to the slice it was made in, back
// goes to the schedule at its instant.
func (r Rule) Settlement(h Held, u job.Usage) (extra, back Cost) {
	held := r.Cost(h)
	counted := u.PromptTokens // OpenAI counts the cached prompt too
	if r.Split {
		if !r.CacheReads {
			counted -= u.CachedTokens
		}
		back.Output = max(held.Output-u.CompletionTokens, 0)
		extra.Output = max(u.CompletionTokens-held.Output, 0)
	} else {
		held.Tokens = h.Prompt // the output was charged at arrival, as reserved
	}
	if d := counted - held.Tokens; d > 0 {
		extra.Tokens = d
	} else {
		back.Tokens = -d
	}
	return extra, back
}

// MinReturn is the least give-back worth a compare-and-set on the model's
// schedule: smaller ones are left spent (they err towards the limit).
const MinReturn = 16

// Unspent is why a reservation goes back unspent.
type Unspent int

const (
	// Unsent: the call never left (its instant lapsed, its reservation
	// did not verify); everything goes back, and on a model with one
	// token limit the pace with it when nothing was placed after it.
	Unsent Unspent = iota
	// Refused: the provider refused the call for rate (429); it counted
	// the request, none of its tokens or units.
	Refused
	// Cancelled: the caller went away before the call; its tokens go back
	// (the request stays spent: its slot has passed).
	Cancelled
)

// Ledger settles and gives back reservations on the models' schedules of
// a Store, each kind of write coalesced per model (coalesce).
type Ledger struct {
	st            *Store
	log           *slog.Logger
	backs, lapses coalesce[Return]
	refunds       coalesce[rewound]
	charges       coalesce[Settlement]
}

// NewLedger returns the ledger of st's schedules.
func NewLedger(st *Store, log *slog.Logger) *Ledger { return &Ledger{st: st, log: log} }

// keyOf is the schedule j's reservation was placed on.
func keyOf(j *task.Task) string { return ModelKey(j.Provider, job.ModelToken(j.Model)) }

// Settle settles j's reservation to the usage u the provider reported:
// what it counted beyond the reservation is charged to the slice it was
// made in, what the reservation held beyond it goes back at its instant
// (paced reservations, MinReturn or more).
func (l *Ledger) Settle(ctx context.Context, r Rule, j *task.Task, u job.Usage) {
	if j.Reservation == nil {
		return
	}
	h := r.Held(j)
	extra, back := r.Settlement(h, u)
	key := keyOf(j)
	if extra.Positive() && h.Slice > 0 {
		l.charge(ctx, j.ID, key, h.Slice, extra)
	}
	at := j.Reservation.SendAt
	if at.IsZero() || back.Tokens+back.Output < MinReturn {
		return
	}
	// The provider was charged the usage (its prompt count at arrival):
	// pace what it was charged (at the configured limits, never above the
	// effective), or each call's margin over its count is time lost.
	l.rewind(ctx, key, at, back, r.Refill)
}

// GiveBack returns what j's paced reservation held and the provider will
// not charge, for why.
func (l *Ledger) GiveBack(ctx context.Context, r Rule, j *task.Task, why Unspent) {
	res := j.Reservation
	if res == nil || res.SendAt.IsZero() {
		return
	}
	c := r.holds(res)
	key := keyOf(j)
	switch why {
	case Unsent:
		if r.Refill.Limited() {
			// What the provider never saw rewinds the pace, whatever was
			// placed after: a lapsed instant is time the schedule gets
			// back, not a gap (on a loaded machine a few a minute). The
			// short window and the minute still bound every plan.
			l.rewind(ctx, key, res.SendAt, c, r.Refill)
			return
		}
		l.giveBack(ctx, key, res.SendAt, c, true)
	case Refused:
		c.Requests = 0
		l.giveBack(ctx, key, res.SendAt, c, false)
	case Cancelled:
		l.giveBack(ctx, key, res.SendAt, Cost{Tokens: c.Tokens}, false)
	}
}

// holds is what res was placed with, as admission signed it (a
// reservation out of bounds goes back as it was placed, not as its parts
// would count).
func (r Rule) holds(res *task.Reservation) Cost {
	c := Cost{Requests: res.Requests, Tokens: res.Tokens, Output: res.Output}
	for i, name := range r.Units {
		c.Units[i] = res.Units[name]
	}
	return c
}

// Correct charges extra to key's current slice: the provider reported
// less room than the schedule holds (someone else spends on its key).
func (l *Ledger) Correct(ctx context.Context, key string, extra Cost) error {
	return l.st.Charge(ctx, key, extra)
}

// giveBack returns c at instant at to key's schedule (lapsed: as
// ReturnLapsed), in one write with the give-backs of the same kind that
// arrive meanwhile.
func (l *Ledger) giveBack(ctx context.Context, key string, at time.Time, c Cost, lapsed bool) {
	if !c.Positive() {
		return
	}
	co := &l.backs
	if lapsed {
		co = &l.lapses
	}
	co.add(key, Return{At: at, Cost: c}, func(key string, rs []Return) {
		if err := l.st.ReturnAll(context.WithoutCancel(ctx), key, rs, lapsed); err != nil {
			l.log.Debug("give back to the schedule", "key", key, "returns", len(rs), "lapsed", lapsed, "err", err)
		}
	})
}

// rewind returns c at instant at to a bucket provider's schedule paced at
// lim (ReturnRewindAll), coalesced per model.
func (l *Ledger) rewind(ctx context.Context, key string, at time.Time, c Cost, lim Limits) {
	l.refunds.add(key, rewound{Return: Return{At: at, Cost: c}, lim: lim}, func(key string, items []rewound) {
		rs := make([]Return, len(items))
		for i, x := range items {
			rs[i] = x.Return
		}
		// The latest limits (configured, never above the effective).
		if err := l.st.ReturnRewindAll(context.WithoutCancel(ctx), key, rs, items[len(items)-1].lim); err != nil {
			l.log.Debug("give back to a bucket's schedule", "key", key, "returns", len(rs), "err", err)
		}
	})
}

// rewound is a give-back to a bucket provider's schedule.
type rewound struct {
	Return
	lim Limits
}

// charge adds extra to the slice key's reservation was made in, coalesced
// per model.
func (l *Ledger) charge(ctx context.Context, jobID, key string, slice int64, extra Cost) {
	l.charges.add(key, Settlement{Slice: slice, Extra: extra}, func(key string, ss []Settlement) {
		if err := l.st.SettleAll(context.WithoutCancel(ctx), key, ss); err != nil {
			l.log.Warn("settle: budget store", "job_id", jobID, "key", key, "settlements", len(ss), "err", err)
		}
	})
}
