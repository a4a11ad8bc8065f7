package executor

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/promptcache"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// feedback owns what calls teach the models' windows: usage settled
// against the reservation, the provider's own count of its minute
// (seed), the lapsed instant of a call that never left, the tokens a call
// that never answered did not spend, and the limits a 429 cuts (refused).
// The budget's writes it makes through the ledger (internal/budget).
type feedback struct {
	*env
	ledger *budget.Ledger
	pcache *promptcache.Registry // warm prompt prefixes (anthropic.go)
	learn  *adapt.Store
	seedMu sync.Mutex
	seeded map[string]time.Time
}

// settle records usage and charges the budget for prompt tokens the
// estimate missed.
func (s *feedback) settle(ctx context.Context, j *task.Task, u job.Usage) {
	s.m.TokensUsed.WithLabelValues(j.Provider, j.Model).Add(float64(u.PromptTokens + u.CompletionTokens))
	s.m.TenantTokens.WithLabelValues(j.Tenant, "input").Add(float64(u.PromptTokens))
	s.m.TenantTokens.WithLabelValues(j.Tenant, "output").Add(float64(u.CompletionTokens))
	s.m.TenantTokens.WithLabelValues(j.Tenant, "cached").Add(float64(u.CachedTokens))
	s.m.TenantTokens.WithLabelValues(j.Tenant, "reasoning").Add(float64(u.ReasoningTokens))
	if j.Estimate == nil || j.Reservation == nil {
		return
	}
	if s.cfg.Calib != nil {
		r := s.cfg.Calib.Observe(ctx, j.Provider, job.ModelToken(j.Model), estimateClass(j), j.Estimate.PromptTokens, u.PromptTokens)
		s.m.EstimateRatio.WithLabelValues(j.Provider, j.Model).Set(r)
	}
	s.settleBudget(ctx, j, u) // settle.go
}

// seed corrects the shared window from the provider's own count: when its
// x-ratelimit-remaining-* shows less room than the window believes (someone
// else spends on the same key), the difference is charged. It never adds
// room, and runs at most once a second per model.
func (s *feedback) seed(ctx context.Context, j *task.Task, rl provider.RateLimit) {
	if rl.RemainingTokens < 0 && rl.RemainingRequests < 0 {
		return
	}
	_, model, ok := s.app().Deployment(j.Provider, j.Model)
	if !ok {
		return
	}
	key := budget.ModelKey(j.Provider, job.ModelToken(j.Model))
	s.seedMu.Lock()
	if s.now().Sub(s.seeded[key]) < time.Second {
		s.seedMu.Unlock()
		return
	}
	s.seeded[key] = s.now()
	s.seedMu.Unlock()
	ac := adapt.For(s.app().Admission, *model)
	if rl.LimitRequests > 0 || rl.LimitTokens > 0 || rl.LimitOutput > 0 {
		if err := s.learn.Observe(ctx, adapt.Key(j.Provider, job.ModelToken(j.Model)), ac, [adapt.Dims]int{rl.LimitRequests, rl.LimitTokens, rl.LimitOutput}); err != nil {
			s.log.Debug("stated limits", "err", err)
		}
	}
	used, err := s.store.Used(ctx, key)
	if err != nil {
		return
	}
	// What the provider counted in its minute: its limit (as it states it,
	// else the configured one) less what it says remains.
	counted := func(stated, configured, remaining int) int {
		if remaining < 0 {
			return -1
		}
		if stated > 0 {
			return stated - remaining
		}
		if configured > 0 {
			return configured - remaining
		}
		return -1
	}
	var extra budget.Cost
	if n := counted(rl.LimitRequests, model.RPM, rl.RemainingRequests); n > used.Requests {
		extra.Requests = n - used.Requests
		s.m.Corrections.WithLabelValues(j.Provider, j.Model, "rpm").Inc()
	}
	if n := counted(rl.LimitTokens, model.TokenLimit(), rl.RemainingTokens); n > used.Tokens {
		extra.Tokens = n - used.Tokens
		s.m.Corrections.WithLabelValues(j.Provider, j.Model, "tpm").Inc()
	}
	if n := counted(rl.LimitOutput, model.OTPM, rl.RemainingOutput); model.SplitsOutput() && n > used.Output {
		extra.Output = n - used.Output
		s.m.Corrections.WithLabelValues(j.Provider, j.Model, "otpm").Inc()
	}
	if extra.Positive() {
		if err := s.ledger.Correct(ctx, key, extra); err != nil {
			s.log.Warn("seed: budget store", "err", err)
		}
	}
}

// giveBackUnsent returns to the model's schedule what a verified, paced
// reservation planned at its instant, when this executor lets it lapse
// without a call (late for the instant, or no slot in time): the provider
// never saw it, and kept, it would push the job's next plan behind its own
// lapsed one (on a model allowed one request a minute, by a minute). Only
// on a dispatch's first delivery: a redelivered one may have been sent by
// an executor that died before acknowledging it.
func (s *feedback) giveBackUnsent(ctx context.Context, msg jetstream.Msg, j *task.Task) {
	r := j.Reservation
	if r == nil || r.SendAt.IsZero() {
		return
	}
	if md, err := msg.Metadata(); err != nil || md.NumDelivered != 1 {
		return
	}
	s.giveBack(ctx, j, budget.Unsent) // settle.go
}

// returnUnusedTokens gives a paced reservation's tokens back to the window
// at its instant, for a job that ends without its call (the request it
// reserved stays spent: its slot has passed).
func (s *feedback) returnUnusedTokens(ctx context.Context, j *task.Task) {
	s.giveBack(ctx, j, budget.Cancelled) // settle.go
}

// refused learns from a rate-limit refusal of j's call: the limits in
// effect are cut (at most once per epoch), and the window gets back the
// tokens and units the provider did not charge.
func (s *feedback) refused(ctx context.Context, j *task.Task, info provider.RateLimitInfo) {
	key := budget.ModelKey(j.Provider, job.ModelToken(j.Model))
	if _, model, ok := s.app().Deployment(j.Provider, j.Model); ok && j.Reservation != nil {
		used, _ := s.store.Used(ctx, key)
		var recent budget.Cost
		if !j.Reservation.SendAt.IsZero() {
			recent, _ = s.store.Recent(ctx, key, j.Reservation.SendAt, budget.Cost{Requests: j.Reservation.Requests, Tokens: j.Reservation.Tokens})
		}
		dim := -1
		switch info.Dimension {
		case "requests":
			dim = adapt.Requests
		case "tokens":
			dim = adapt.Tokens
		case "output_tokens":
			dim = adapt.Output
		}
		cut, reason, err := s.learn.Cut(ctx, adapt.Key(j.Provider, job.ModelToken(j.Model)), adapt.For(s.app().Admission, *model), adapt.Refusal{
			Kind: info.Kind, Dim: dim, ReservedAt: j.Reservation.ReservedAt, RetryAfter: info.RetryAfter,
			Stated: [adapt.Dims]int{info.StatedLimitRequests, info.StatedLimitTokens, info.StatedLimitOutput}, Used: used, Recent: recent,
			Cost: budget.Cost{Requests: j.Reservation.Requests, Tokens: j.Reservation.Tokens, Output: j.Reservation.Output}})
		if err != nil {
			s.log.Warn("learn from 429", "err", err)
		}
		if cut {
			s.m.LimitCuts.WithLabelValues(j.Provider, j.Model, reason).Inc()
			s.log.Info("limits cut", "provider", j.Provider, "model", j.Model, "reason", reason)
		}
		s.ledger.GiveBack(ctx, model.Rule(), j, budget.Refused)
	}
}
