package budget_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// The two provider kinds' rules, as config.Model.Rule makes them.
var (
	oneLimit = budget.Rule{}
	apart    = budget.Rule{Split: true, Refill: budget.Limits{RPM: 600, TPM: 60_000, OTPM: 30_000}}
	// apart, on a model whose cache reads count toward its input limit.
	readsCount = budget.Rule{Split: true, CacheReads: true, Refill: apart.Refill}
)

// TestRuleCounts: one token limit holds prompt + output on the tokens
// dimension; input and output apart hold the input less the cached part
// (unless cache reads count) and the output on its own dimension.
func TestRuleCounts(t *testing.T) {
	t.Parallel()
	h := budget.Held{Requests: 1, Prompt: 1000, Cached: 600, Output: 500}
	for _, tc := range []struct {
		name string
		rule budget.Rule
		want budget.Cost
	}{
		{"one limit", oneLimit, budget.Cost{Requests: 1, Tokens: 1500}},
		{"apart", apart, budget.Cost{Requests: 1, Tokens: 400, Output: 500}},
		{"apart, cache reads count", readsCount, budget.Cost{Requests: 1, Tokens: 1000, Output: 500}},
	} {
		if got := tc.rule.Cost(h); got != tc.want {
			t.Errorf("%s: Cost = %+v, want %+v", tc.name, got, tc.want)
		}
	}
	// A claim from an estimate, placed at a correction: the prompt moves,
	// never past the model's minute or the estimate, whichever is larger.
	est := &job.Estimate{PromptTokens: 1000, MaxTokens: 500}
	for _, tc := range []struct {
		name          string
		rule          budget.Rule
		placed, limit int
		want          int // the prompt held
	}{
		{"one limit, above", oneLimit, 1300, 0, 1300},
		{"one limit, below", oneLimit, 600, 0, 600},
		{"one limit, clamped to the minute", oneLimit, 1300, 1600, 1100},
		{"one limit, the estimate above the minute", oneLimit, 1300, 1200, 1000},
		{"apart, clamped to the minute", apart, 1300, 1100, 1100},
		{"apart, the estimate above the minute", apart, 1300, 900, 1000},
	} {
		if got := tc.rule.Place(tc.rule.Claim(est), tc.placed, tc.limit).Prompt; got != tc.want {
			t.Errorf("%s: placed prompt %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestSettlementBothWays: the provider's count settles what was held, by
// its kind's rule, whether it counts above or below the estimate, with
// cache reads and writes.
func TestSettlementBothWays(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		rule        budget.Rule
		held        budget.Held
		u           job.Usage
		extra, back budget.Cost
	}{
		// One limit: the prompt is settled, the output (charged max
		// tokens at arrival) is not; cached prompt tokens count.
		{"one limit, counted above", oneLimit, budget.Held{Prompt: 1000, Output: 500},
			job.Usage{PromptTokens: 1300, CompletionTokens: 20}, budget.Cost{Tokens: 300}, budget.Cost{}},
		{"one limit, counted below", oneLimit, budget.Held{Prompt: 1000, Output: 500},
			job.Usage{PromptTokens: 600, CompletionTokens: 499}, budget.Cost{}, budget.Cost{Tokens: 400}},
		{"one limit, cache read", oneLimit, budget.Held{Prompt: 1000, Output: 500},
			job.Usage{PromptTokens: 1000, CachedTokens: 800}, budget.Cost{}, budget.Cost{}},
		// Apart: input and output each settled to the count.
		{"apart, counted above", apart, budget.Held{Prompt: 1000, Output: 500},
			job.Usage{PromptTokens: 1300, CompletionTokens: 700}, budget.Cost{Tokens: 300, Output: 200}, budget.Cost{}},
		{"apart, counted below", apart, budget.Held{Prompt: 1000, Output: 500},
			job.Usage{PromptTokens: 600, CompletionTokens: 100}, budget.Cost{}, budget.Cost{Tokens: 400, Output: 400}},
		// A warm prefix held as cached: reads are free, a provider that
		// counts the prompt 1.3x (or 0.6x) of the estimate settles the
		// turn after it (the livelock of the held-out findings).
		{"apart, warm prefix counted above", apart, budget.Held{Prompt: 1000, Cached: 800, Output: 500},
			job.Usage{PromptTokens: 1300, CachedTokens: 1040, CompletionTokens: 500}, budget.Cost{Tokens: 60}, budget.Cost{}},
		{"apart, warm prefix counted below", apart, budget.Held{Prompt: 1000, Cached: 800, Output: 500},
			job.Usage{PromptTokens: 600, CachedTokens: 480, CompletionTokens: 500}, budget.Cost{}, budget.Cost{Tokens: 80}},
		// A cache write is input; a prefix expected warm and written
		// again (expired) is charged in full.
		{"apart, cache write", apart, budget.Held{Prompt: 1000, Output: 500},
			job.Usage{PromptTokens: 1000, CacheWriteTokens: 800, CompletionTokens: 500}, budget.Cost{}, budget.Cost{}},
		{"apart, warm prefix gone cold", apart, budget.Held{Prompt: 1000, Cached: 800, Output: 500},
			job.Usage{PromptTokens: 1000, CacheWriteTokens: 800, CompletionTokens: 500}, budget.Cost{Tokens: 800}, budget.Cost{}},
		{"apart, cache reads count", readsCount, budget.Held{Prompt: 1000, Output: 500},
			job.Usage{PromptTokens: 1000, CachedTokens: 800, CompletionTokens: 500}, budget.Cost{}, budget.Cost{}},
	} {
		extra, back := tc.rule.Settlement(tc.held, tc.u)
		if extra != tc.extra || back != tc.back {
			t.Errorf("%s: extra %+v back %+v, want %+v and %+v", tc.name, extra, back, tc.extra, tc.back)
		}
	}
}

// placedJob places one job's claim by rule on b's store at once and
// returns it as the executor receives it.
func placedJob(t *testing.T, b *bundle, rule budget.Rule, est job.Estimate, cached int) *task.Task {
	t.Helper()
	h := rule.Claim(&est)
	h.Cached = cached
	lim := budget.Limits{RPM: 600, TPM: 600_000, OTPM: 300_000}
	g, err := b.store.Take(context.Background(), budget.ModelKey("p", "m"), lim, []budget.Cost{rule.Cost(h)})
	if err != nil || g.N != 1 {
		t.Fatalf("place: %+v %v", g, err)
	}
	h.Slice = b.store.SliceOf(g.SendAt[0])
	r := rule.Reserve(h)
	r.SendAt = g.SendAt[0]
	return &task.Task{Job: job.Job{ID: job.NewID(), Provider: "p"}, Model: "m", Estimate: &est, Reservation: r}
}

func used(t *testing.T, b *bundle) budget.Cost {
	t.Helper()
	u, err := b.store.Used(context.Background(), budget.ModelKey("p", "m"))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestLedgerSettles: settled on a store, the window holds what the
// provider counted, for both rules and both directions of the estimate's
// error; a reservation from before Slice and Prompt (read the old way)
// settles the same.
func TestLedgerSettles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	est := job.Estimate{PromptTokens: 1000, MaxTokens: 500}
	for _, tc := range []struct {
		name   string
		rule   budget.Rule
		cached int
		u      job.Usage
		want   budget.Cost // the window after
	}{
		{"one limit, above", oneLimit, 0, job.Usage{PromptTokens: 1300, CompletionTokens: 10}, budget.Cost{Requests: 1, Tokens: 1800}},
		{"one limit, below", oneLimit, 0, job.Usage{PromptTokens: 600, CompletionTokens: 10}, budget.Cost{Requests: 1, Tokens: 1100}},
		{"apart, above", apart, 0, job.Usage{PromptTokens: 1300, CompletionTokens: 600}, budget.Cost{Requests: 1, Tokens: 1300, Output: 600}},
		{"apart, below", apart, 0, job.Usage{PromptTokens: 600, CompletionTokens: 100}, budget.Cost{Requests: 1, Tokens: 600, Output: 100}},
		{"apart, warm prefix above", apart, 800, job.Usage{PromptTokens: 1300, CachedTokens: 1040, CompletionTokens: 500}, budget.Cost{Requests: 1, Tokens: 260, Output: 500}},
	} {
		for _, legacy := range []bool{false, true} {
			b := setup(t, pacedParams)
			l := budget.NewLedger(b.store, slog.New(slog.DiscardHandler))
			j := placedJob(t, b, tc.rule, est, tc.cached)
			if legacy {
				// As an admission from before the parts wrote it, through
				// its wire form.
				j.Reservation.Slice, j.Reservation.Prompt = 0, 0
				data, _ := json.Marshal(j.Reservation)
				var r task.Reservation
				if err := json.Unmarshal(data, &r); err != nil {
					t.Fatal(err)
				}
				j.Reservation = &r
			}
			l.Settle(ctx, tc.rule, j, tc.u)
			if got := used(t, b); got != tc.want {
				t.Errorf("%s (legacy %v): window holds %+v, want %+v", tc.name, legacy, got, tc.want)
			}
		}
	}
}

// TestLedgerGivesBack: what goes back unspent, by why: everything when
// the call never left, the tokens and output when the provider refused it
// for rate (it counted the request), the tokens when the caller went away.
func TestLedgerGivesBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	est := job.Estimate{PromptTokens: 1000, MaxTokens: 500}
	for _, tc := range []struct {
		name string
		rule budget.Rule
		why  budget.Unspent
		want budget.Cost
	}{
		{"one limit, unsent", oneLimit, budget.Unsent, budget.Cost{}},
		{"one limit, refused", oneLimit, budget.Refused, budget.Cost{Requests: 1}},
		{"one limit, cancelled", oneLimit, budget.Cancelled, budget.Cost{Requests: 1}},
		{"apart, unsent", apart, budget.Unsent, budget.Cost{}},
		{"apart, refused", apart, budget.Refused, budget.Cost{Requests: 1}},
		{"apart, cancelled", apart, budget.Cancelled, budget.Cost{Requests: 1, Output: 500}},
	} {
		b := setup(t, pacedParams)
		l := budget.NewLedger(b.store, slog.New(slog.DiscardHandler))
		j := placedJob(t, b, tc.rule, est, 0)
		l.GiveBack(ctx, tc.rule, j, tc.why)
		if got := used(t, b); got != tc.want {
			t.Errorf("%s: window holds %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestHeldReadsOldReservations: a reservation without Slice and Prompt
// (made before they were carried) reads as the same parts as one with
// them.
func TestHeldReadsOldReservations(t *testing.T) {
	t.Parallel()
	est := job.Estimate{PromptTokens: 1000, MaxTokens: 500}
	for _, rule := range []budget.Rule{oneLimit, apart} {
		h := rule.Claim(&est)
		h.Slice, h.Prompt, h.Cached = 7_000_000_123, 1200, 0
		if rule.Split {
			h.Cached = 700
		}
		r := rule.Reserve(h)
		old := *r
		old.Slice, old.Prompt = 0, 0
		got := rule.Held(&task.Task{Estimate: &est, Reservation: &old})
		if got != h {
			t.Errorf("split %v: old reservation %+v reads %+v, want %+v", rule.Split, old, got, h)
		}
		if old.ID != "7000000123-0" {
			t.Errorf("ID %q, want the slice before the dash (executors before Slice read it)", old.ID)
		}
	}
}

// TestSettlingPacesWhatWasCharged: a call the provider counted less than
// its reservation gives the difference back to the pace too, on one token
// limit as on limits apart, so the next call is paced after what the
// provider was charged. At 60,000 TPM (a token a millisecond) a 1,500-token
// reservation settled to 1,100 lets the next 1,500-token call leave 1.1 s
// after it, not 1.5 s (its short window alone needs 1.025 s).
func TestSettlingPacesWhatWasCharged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rule := budget.Rule{Refill: budget.Limits{RPM: 600, TPM: 60_000}}
	est := job.Estimate{PromptTokens: 1000, MaxTokens: 500}
	b := setup(t, pacedParams)
	l := budget.NewLedger(b.store, slog.New(slog.DiscardHandler))
	key := budget.ModelKey("p", "m")
	h := rule.Claim(&est)
	g, err := b.store.Take(ctx, key, rule.Refill, []budget.Cost{rule.Cost(h)})
	if err != nil || g.N != 1 {
		t.Fatalf("place: %+v %v", g, err)
	}
	h.Slice = b.store.SliceOf(g.SendAt[0])
	r := rule.Reserve(h)
	r.SendAt = g.SendAt[0]
	j := &task.Task{Job: job.Job{ID: job.NewID(), Provider: "p"}, Model: "m", Estimate: &est, Reservation: r}
	l.Settle(ctx, rule, j, job.Usage{PromptTokens: 600, CompletionTokens: 20})
	next, err := b.store.Take(ctx, key, rule.Refill, []budget.Cost{rule.Cost(h)})
	if err != nil || next.N != 1 {
		t.Fatalf("next: %+v %v", next, err)
	}
	if d := next.SendAt[0].Sub(g.SendAt[0]); d > 1100*time.Millisecond+time.Millisecond {
		t.Errorf("next call %v after the settled one, want 1.1 s (paced at the 1,100 tokens charged)", d)
	}
}

// TestLapsedInstantRewindsThePace: an instant let lapse (the call never
// left) gives its time back to the pace even when a later call was placed
// after it. At 60,000 TPM 1,500-token calls are paced 1.5 s apart; with the
// first given back unsent, the third follows the second by its short window
// (1.025 s), not by the pace of both (3 s after the first).
func TestLapsedInstantRewindsThePace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rule := budget.Rule{Refill: budget.Limits{RPM: 600, TPM: 60_000}}
	est := job.Estimate{PromptTokens: 1000, MaxTokens: 500}
	b := setup(t, pacedParams)
	l := budget.NewLedger(b.store, slog.New(slog.DiscardHandler))
	key := budget.ModelKey("p", "m")
	h := rule.Claim(&est)
	g, err := b.store.Take(ctx, key, rule.Refill, []budget.Cost{rule.Cost(h), rule.Cost(h)})
	if err != nil || g.N != 2 {
		t.Fatalf("place: %+v %v", g, err)
	}
	h.Slice = b.store.SliceOf(g.SendAt[0])
	r := rule.Reserve(h)
	r.SendAt = g.SendAt[0]
	l.GiveBack(ctx, rule, &task.Task{Job: job.Job{ID: job.NewID(), Provider: "p"}, Model: "m", Estimate: &est, Reservation: r}, budget.Unsent)
	b.clock.Advance(time.Second) // the third within the horizon either way
	next, err := b.store.Take(ctx, key, rule.Refill, []budget.Cost{rule.Cost(h)})
	if err != nil || next.N != 1 {
		t.Fatalf("third call not placed within the horizon (%s, retry at %v after the second; err %v): the lapsed instant's pace was kept",
			next.Reason, next.RetryAt.Sub(g.SendAt[1]), err)
	}
	want := g.SendAt[1].Add(time.Second + pacedParams.Tolerance)
	if d := next.SendAt[0].Sub(want); d > time.Millisecond {
		t.Errorf("third call %v after the second, want %v (its short window): the lapsed instant's pace was kept",
			next.SendAt[0].Sub(g.SendAt[1]), time.Second+pacedParams.Tolerance)
	}
}
