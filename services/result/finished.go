package result

import (
	"context"
	"log/slog"
	"regexp"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// finished does what a job's end calls for once, when its result is first
// recorded: it settles the job's spend hold, counts its result and cost,
// and writes the request log's one line for it (docs/OPERATIONS.md).
func (s *Service) finished(ctx context.Context, r *job.Result, f *mesh.JobFacts) {
	tenant := s.tenantLabel(r.Tenant)
	s.m.Results.WithLabelValues(tenant, string(r.Status)).Inc()
	if f != nil && s.validHold(r, f.Spend) {
		if err := s.spend.Settle(ctx, r.Tenant, *f.Spend, spentOf(r, f.Spend)); err != nil {
			s.log.Warn("spend hold not settled; it stays held until its window ends", "job_id", r.JobID, "err", err)
		}
	}
	if r.Cost != nil && r.DuplicateOf == "" && tenant != "unknown" {
		if p, m, ok := s.app().Deployment(r.Provider, r.Model); ok {
			s.m.Cost.WithLabelValues(tenant, p.Name, m.Name).Add(*r.Cost)
		}
	}
	if s.log.Enabled(ctx, slog.LevelInfo) { // the line's attributes are not made for nothing
		s.log.Info("job finished", requestLog(r, f)...)
	}
}

// spentOf is what a job holding h is charged when it ends with r: the
// cost of the usage the provider reported; its whole hold when the usage
// is Sluice's estimate or unpriced, or when a call may have been billed
// without usage reported (a stream cut, an outcome unknown); nothing when
// no call was answered.
func spentOf(r *job.Result, h *task.SpendHold) int64 {
	switch {
	case r.Usage != nil && r.Cost != nil && r.UsageSource == job.UsageProvider:
		return budget.Nanos(*r.Cost)
	case r.Usage != nil:
		if r.Cost != nil {
			return max(h.Amount, budget.Nanos(*r.Cost))
		}
		return h.Amount
	case r.Status == job.StatusInterrupted, r.Error != nil && r.Error.Code == dlq.ReasonOutcomeUnknown:
		return h.Amount
	}
	return 0
}

var (
	holdDay   = regexp.MustCompile(`^\d{8}$`)
	holdMonth = regexp.MustCompile(`^\d{6}$`)
)

// validHold checks a spend hold read from a result's headers: a
// configured tenant with a spend budget, a sane amount and windows.
func (s *Service) validHold(r *job.Result, h *task.SpendHold) bool {
	if h == nil {
		return false
	}
	t, ok := s.app().Tenant(r.Tenant)
	return ok && t.Spend != nil && h.Amount > 0 && h.Amount <= 1e18 &&
		(h.Day == "" || holdDay.MatchString(h.Day)) && (h.Month == "" || holdMonth.MatchString(h.Month))
}

// requestLog is the request log's line for a finished job: what happened
// to it, never what it said (no prompt, no completion; the caller's user
// only as a hash).
func requestLog(r *job.Result, f *mesh.JobFacts) []any {
	a := []any{slog.String("job_id", r.JobID), slog.String("tenant", r.Tenant), slog.String("model", r.Model),
		slog.String("deployment", r.Provider)}
	if f != nil && f.Priority != "" {
		a = append(a, slog.String("priority", string(f.Priority)))
	}
	a = append(a, slog.String("status", string(r.Status)), slog.Int("attempts", r.Attempts))
	if r.Error != nil {
		a = append(a, slog.String("code", r.Error.Code))
	}
	if r.DuplicateOf != "" {
		a = append(a, slog.String("duplicate_of", r.DuplicateOf))
	}
	if r.TraceID != "" {
		a = append(a, slog.String("trace_id", r.TraceID))
	}
	if r.ProviderRequestID != "" {
		a = append(a, slog.String("provider_request_id", r.ProviderRequestID))
	}
	if u := r.Usage; u != nil {
		a = append(a, slog.Int("prompt_tokens", u.PromptTokens), slog.Int("completion_tokens", u.CompletionTokens),
			slog.Int("cached_tokens", u.CachedTokens), slog.String("usage_source", r.UsageSource))
	}
	if f != nil {
		if f.QueueWaitMS > 0 {
			a = append(a, slog.Int64("queue_wait_ms", f.QueueWaitMS))
		}
		if f.WaitReason != "" {
			a = append(a, slog.String("wait_reason", f.WaitReason))
		}
		if f.TTFTMS > 0 {
			a = append(a, slog.Int64("ttft_ms", f.TTFTMS))
		}
		if f.User != "" {
			a = append(a, slog.String("user_hash", f.User))
		}
	}
	if !r.SubmittedAt.IsZero() && !r.CompletedAt.IsZero() {
		a = append(a, slog.Int64("latency_ms", r.CompletedAt.Sub(r.SubmittedAt).Milliseconds()))
	}
	switch {
	case r.Cost != nil:
		a = append(a, slog.Float64("cost", *r.Cost))
	case r.CostUnpriced:
		a = append(a, slog.Bool("cost_unpriced", true))
	}
	return a
}
