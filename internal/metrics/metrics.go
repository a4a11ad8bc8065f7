// Package metrics defines every Prometheus metric Sluice exports. One Set is
// made per process in run and shared by the services it runs, so a metric is
// registered once whichever services run together. Label values are bounded:
// providers, models, tenants and priorities come from configuration, never
// from raw input.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
)

// Set is all of Sluice's metrics.
type Set struct {
	JobsAccepted        *prometheus.CounterVec // tenant, via
	JobsRejected        *prometheus.CounterVec // via, code
	Results             *prometheus.CounterVec // tenant, status
	Cost                *prometheus.CounterVec // tenant, provider, model
	Requests            *prometheus.CounterVec // provider, model, status
	TokensReserved      *prometheus.CounterVec // provider, model
	TokensUsed          *prometheus.CounterVec // provider, model
	Retries             *prometheus.CounterVec // provider, model, error_type
	RateLimitHits       *prometheus.CounterVec // provider, model, limit_type
	Fallbacks           *prometheus.CounterVec // from_provider, to_provider, reason
	DupSuppressed       *prometheus.CounterVec // task_type
	QueueDepth          *prometheus.GaugeVec   // priority, task_type
	QueueWait           *prometheus.HistogramVec
	AdmissionWaits      *prometheus.CounterVec // provider, model, reason
	BudgetWrites        prometheus.Counter
	BudgetConflict      prometheus.Counter
	BudgetErrors        prometheus.Counter
	BudgetOwner         *prometheus.CounterVec   // path
	RepliesDropped      *prometheus.CounterVec   // service
	ConsumeRestarts     *prometheus.CounterVec   // stream, reason
	ReservationsExpired *prometheus.CounterVec   // provider, model
	Requeues            *prometheus.CounterVec   // provider, model, reason
	RequeueLimited      *prometheus.CounterVec   // provider, model, reason
	TenantRequests      *prometheus.CounterVec   // tenant
	TenantTokens        *prometheus.CounterVec   // tenant, kind (input, output, cached, reasoning)
	InFlight            *prometheus.GaugeVec     // provider, model
	ConcLeased          *prometheus.GaugeVec     // provider, model
	Pauses              *prometheus.CounterVec   // provider, model
	Shed                *prometheus.CounterVec   // tenant, priority
	Held                *prometheus.GaugeVec     // priority
	EstimateRatio       *prometheus.GaugeVec     // provider, model
	PromptCache         *prometheus.CounterVec   // provider, model, tenant, kind (read, write, uncached)
	Corrections         *prometheus.CounterVec   // provider, model, limit
	DeadLetters         *prometheus.CounterVec   // reason
	ModelLimit          *prometheus.GaugeVec     // provider, model, limit
	ProviderLatency     *prometheus.HistogramVec // provider, model
	LimitEffective      *prometheus.GaugeVec     // provider, model, dimension
	LimitCuts           *prometheus.CounterVec   // provider, model, reason
	RateLimitRequeues   *prometheus.CounterVec   // provider, model, outcome
	SendLateness        *prometheus.HistogramVec // provider, model
	RateLimitKinds      *prometheus.CounterVec   // provider, model, kind
	TimeToFirstToken    *prometheus.HistogramVec // provider, model
	StreamInterrupted   *prometheus.CounterVec   // provider, model, reason
	StreamDuration      *prometheus.HistogramVec // provider, model, outcome
	OutcomeUnknown      *prometheus.CounterVec   // provider, model, reason
	HeldOldest          prometheus.Gauge
	DeploymentChanges   *prometheus.CounterVec // provider, model, state (internal/health)
	DeploymentState     *prometheus.GaugeVec   // provider, model
	// Deployments of a model group (deployments.go).
	DeploymentPlaced   *prometheus.CounterVec // provider, model
	DeploymentFill     *prometheus.GaugeVec   // provider, model, dimension
	DeploymentCooldown *prometheus.GaugeVec   // provider, model
	BreakerState       *prometheus.GaugeVec   // provider, model
	AffinityJobs       *prometheus.CounterVec // model, outcome
	BuildInfo          *prometheus.GaugeVec   // version, revision, go_version (build.go)
	// The batch lane (lane.go).
	LaneJobs, LaneBatches, LaneLines, LaneWaits, LaneSaved *prometheus.CounterVec
	LaneOpen, LaneEnqueued                                 *prometheus.GaugeVec
}

// New makes and registers the metrics on reg.
func New(reg prometheus.Registerer) *Set {
	s := &Set{
		JobsAccepted:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_jobs_accepted_total", Help: "Jobs accepted by ingest."}, []string{"tenant", "via"}),
		JobsRejected:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_jobs_rejected_total", Help: "Jobs refused, by where they were read (http, nats: ingest; queue: admission; dispatch: executor) and error code."}, []string{"via", "code"}),
		Results:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_results_total", Help: "Terminal results written, by status."}, []string{"tenant", "status"}),
		Requests:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_requests_total", Help: "Provider calls by outcome (HTTP status, or transport error class)."}, []string{"provider", "model", "status"}),
		TokensReserved: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_tokens_reserved_total", Help: "Tokens reserved at admission (prompt estimate + max output)."}, []string{"provider", "model"}),
		TokensUsed:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_tokens_used_total", Help: "Tokens the provider reported using (prompt + completion)."}, []string{"provider", "model"}),
		Retries:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_retries_total", Help: "Provider attempts that were retried, by error class."}, []string{"provider", "model", "error_type"}),
		RateLimitHits:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_rate_limit_hits_total", Help: "429 rate-limit answers from providers, by limit type."}, []string{"provider", "model", "limit_type"}),
		Fallbacks:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_fallbacks_total", Help: "Jobs routed to a fallback provider."}, []string{"from_provider", "to_provider", "reason"}),
		DupSuppressed:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_duplicate_suppressed_total", Help: "Provider calls avoided because the operation was already done or in progress."}, []string{"task_type"}),
		QueueDepth:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "llm_queue_depth", Help: "Jobs waiting in QUEUE."}, []string{"priority", "task_type"}),
		QueueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llm_queue_wait_seconds", Help: "Time from acceptance to dispatch.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}}, []string{"priority", "task_type"}),
		AdmissionWaits:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_admission_deferrals_total", Help: "Jobs sent back to wait by admission, by reason (rpm, tpm, burst, not_before)."}, []string{"provider", "model", "reason"}),
		BudgetWrites:        prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_budget_writes_total", Help: "Successful writes to the budgets bucket."}),
		BudgetConflict:      prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_budget_conflicts_total", Help: "Compare-and-set conflicts on the budgets bucket."}),
		BudgetErrors:        prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_budget_errors_total", Help: "Failures to reach the budgets bucket (no dispatch happens without budget)."}),
		BudgetOwner:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_budget_owner_writes_total", Help: "Writes of a model's schedule with admission.schedule_owner on, by path: served (applied as its owner), forwarded (applied by the owner in another process), fallback (written to the KV here), dropped (a give-back the owner did not confirm in time, left spent)."}, []string{"path"}),
		Requeues:            prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_requeues_total", Help: "Jobs an executor sent back to admission without a provider call, by reason (unverified, lapsed, tenant_slot, breaker_open, deployment_down, drained, fallback)."}, []string{"provider", "model", "reason"}),
		RequeueLimited:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_requeue_limited_total", Help: "Jobs dead-lettered (requeue_limit) because they went back to admission more times in a row for one reason than its bound allows."}, []string{"provider", "model", "reason"}),
		ReservationsExpired: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_reservations_expired_total", Help: "Jobs whose reservation lapsed before an executor could start them; re-admitted."}, []string{"provider", "model"}),
		TenantRequests:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_tenant_requests_total", Help: "Provider requests made for each tenant."}, []string{"tenant"}),
		TenantTokens:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_tenant_tokens_total", Help: "Tokens used for each tenant by kind (input, output, cached; reasoning: the part of output a reasoning model spent thinking)."}, []string{"tenant", "kind"}),
		DeadLetters:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_dead_letters_total", Help: "Jobs written to the DLQ, by reason."}, []string{"reason"}),
		EstimateRatio:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_token_estimate_ratio", Help: "The correction admission applies to the model's prompt estimates: a high quantile of provider-reported prompt tokens over Sluice's estimate, over the fleet's recent answers (1 = exact)."}, []string{"provider", "model"}),
		Corrections:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_budget_corrections_total", Help: "Times a provider's x-ratelimit-remaining-* showed less room than the shared window, which was then charged the difference."}, []string{"provider", "model", "limit"}),
		Pauses:              prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_provider_pauses_total", Help: "Times a provider's Retry-After paused a model's dispatch across the fleet."}, []string{"provider", "model"}),
		Shed:                prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_shed_total", Help: "Jobs refused at ingest by load shedding, by tenant and priority."}, []string{"tenant", "priority"}),
		Held:                prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_admission_held", Help: "Jobs this admission process holds in its fair queues, by priority."}, []string{"priority"}),
		ConcLeased:          prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_concurrency_leased", Help: "Call slots this process holds on the fleet-wide concurrency lease."}, []string{"provider", "model"}),
		ModelLimit:          prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_model_limit", Help: "Configured limits per provider/model (limit: rpm, tpm, concurrency, <unit>_per_minute)."}, []string{"provider", "model", "limit"}),
		InFlight:            prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_inflight_calls", Help: "Provider calls in progress in this process."}, []string{"provider", "model"}),
		ProviderLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llm_provider_latency_seconds", Help: "Provider call duration.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}, []string{"provider", "model"}),
		LimitEffective:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_limit_effective", Help: "Limits admission paces against: the lowest of configured, stated by the provider and learned from 429s (dimension: requests_per_minute, tokens_per_minute, requests_per_second, tokens_per_second, and <unit>_per_minute, <unit>_per_second for each unit the model limits; 0 = unlimited)."}, []string{"provider", "model", "dimension"}),
		LimitCuts:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_limit_cuts_total", Help: "Times the limits in effect were lowered (reason: burst, minute, concurrency, acceleration, stated), at most once per epoch."}, []string{"provider", "model", "reason"}),
		RateLimitRequeues: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rate_limit_requeues_total", Help: "Admitted jobs the provider refused for rate, sent back to admission without spending an attempt (outcome: requeued, or cap when admission.max_rate_limited ended the job), and calls planned before a cut that were not sent (outcome: drained)."}, []string{"provider", "model", "outcome"}),
		RateLimitKinds:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rate_limit_refusals_total", Help: "429 rate-limit answers by what they say (kind: burst, minute, concurrency, acceleration, quota, unknown)."}, []string{"provider", "model", "kind"}),
		SendLateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_send_lateness_seconds", Help: "How long after its planned instant a paced call left the executor.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .015, .02, .025, .05, .1, .25, 1}}, []string{"provider", "model"}),
		TimeToFirstToken: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llm_time_to_first_token_seconds", Help: "From sending a streamed call to its first content or tool-call delta.",
			Buckets: []float64{.025, .05, .1, .25, .5, 1, 2, 4, 8, 15, 30, 60}}, []string{"provider", "model"}),
		StreamInterrupted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "llm_stream_interrupted_total", Help: "Streams that broke after their first token (reason: cut, idle_timeout, total_timeout, error_event, executor_lost, cancelled, too_large); the job ends interrupted (cancelled for cancelled, failed response_too_large for too_large) and is never retried."}, []string{"provider", "model", "reason"}),
		PromptCache:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_prompt_cache_tokens_total", Help: "Prompt tokens of calls with a cache breakpoint, as the provider reported them: read from its cache (not charged toward an input-tokens limit unless cache_reads_count), written to it, and neither. Hit ratio: read / (read + write + uncached)."}, []string{"provider", "model", "tenant", "kind"}),
		StreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "llm_stream_duration_seconds", Help: "Streamed calls from sending to their end, by outcome (succeeded, interrupted, cancelled).",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14)}, []string{"provider", "model", "outcome"}),
		OutcomeUnknown: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_outcome_unknown_total", Help: "Jobs ended outcome_unknown: a call that may have reached the provider and whose outcome is unknown (reason: executor_lost, or the transport error that cut it), not sent again because its provider is not configured as honouring idempotency keys; each is in the DLQ."}, []string{"provider", "model", "reason"}),
		HeldOldest:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_held_oldest_seconds", Help: "How long the oldest job this admission process holds has waited in it (a watchdog: a model's held jobs go back to the queue after a minute without a dispatch)."}),
	}
	s.DeploymentChanges = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_deployment_state_changes_total", Help: "Deployment health changes this process wrote, by the state entered (cooling: a Retry-After; down: a refused key, an unreachable endpoint or an open breaker; up: a call succeeded after either)."}, []string{"provider", "model", "state"})
	s.DeploymentState = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_deployment_state", Help: "Each deployment's health as the fleet shares it: 0 up, 1 cooling, 2 down (no job is placed on it until a probe succeeds)."}, []string{"provider", "model"})
	reg.MustRegister(s.DeploymentChanges, s.DeploymentState)
	s.Cost = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_cost_total", Help: "What the calls of finished jobs cost, in the configuration's currency (usage times the model's price; unpriced models are not counted)."}, []string{"tenant", "provider", "model"})
	reg.MustRegister(s.Cost)
	s.RepliesDropped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_nats_replies_dropped_total", Help: "NATS requests a service did not answer because their reply subject was not one it may answer on (a reply aimed at another subject)."}, []string{"service"})
	reg.MustRegister(s.RepliesDropped)
	s.ConsumeRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_consume_restarts_total", Help: "Consume loops started again after they ended by themselves, by stream and reason (no_responders: a pull no server answered, the consumer without a leader; consumer_deleted; bad_request: a pull refused; other)."}, []string{"stream", "reason"})
	reg.MustRegister(s.ConsumeRestarts)
	s.newDeployments(reg)
	s.newLane(reg)
	s.newBuild(reg)
	reg.MustRegister(s.JobsAccepted, s.JobsRejected, s.Results, s.Requests, s.TokensReserved, s.TokensUsed,
		s.Retries, s.RateLimitHits, s.Fallbacks, s.DupSuppressed, s.QueueDepth, s.QueueWait, s.AdmissionWaits,
		s.BudgetWrites, s.BudgetConflict, s.BudgetErrors, s.BudgetOwner, s.ReservationsExpired, s.Requeues, s.RequeueLimited, s.TenantRequests, s.TenantTokens,
		s.InFlight, s.ProviderLatency, s.ConcLeased, s.ModelLimit, s.DeadLetters, s.EstimateRatio, s.Corrections, s.Pauses, s.Shed, s.Held,
		s.LimitEffective, s.LimitCuts, s.RateLimitRequeues, s.SendLateness, s.RateLimitKinds,
		s.TimeToFirstToken, s.StreamInterrupted, s.StreamDuration, s.OutcomeUnknown, s.HeldOldest, s.PromptCache)
	return s
}

// Preset creates the series that configuration makes possible, at zero, so
// dashboards and alerts see them before the first event (a rate over a
// series that does not exist yet is empty, not zero).
func (s *Set) Preset(c *config.Config) {
	tasks := []string{"default"}
	for _, r := range c.Routes {
		if r.Task != "" && r.Task != "*" {
			tasks = append(tasks, r.Task)
		}
	}
	for _, p := range []string{"interactive", "standard", "batch"} {
		s.QueueDepth.WithLabelValues(p, "all")
		for _, t := range tasks {
			s.QueueWait.WithLabelValues(p, t)
		}
	}
	for _, t := range tasks {
		s.DupSuppressed.WithLabelValues(t)
	}
	for _, p := range c.Providers {
		for _, m := range p.Models {
			s.TokensReserved.WithLabelValues(p.Name, m.Name)
			s.TokensUsed.WithLabelValues(p.Name, m.Name)
			for _, lt := range []string{"requests", "tokens"} {
				s.RateLimitHits.WithLabelValues(p.Name, m.Name, lt)
			}
			for _, et := range []string{"rate_limited", "overloaded", "connect", "unknown"} {
				s.Retries.WithLabelValues(p.Name, m.Name, et)
			}
			for _, k := range []string{"burst", "minute", "concurrency", "acceleration", "quota", "unknown"} {
				s.RateLimitKinds.WithLabelValues(p.Name, m.Name, k)
			}
			for _, r := range []string{"burst", "minute", "concurrency", "acceleration", "stated"} {
				s.LimitCuts.WithLabelValues(p.Name, m.Name, r)
			}
			for _, o := range []string{"requeued", "cap", "drained"} {
				s.RateLimitRequeues.WithLabelValues(p.Name, m.Name, o)
			}
			for _, st := range []string{"cooling", "down", "up"} {
				s.DeploymentChanges.WithLabelValues(p.Name, m.Name, st)
			}
		}
	}
	for _, r := range c.Routes {
		for _, f := range r.Fallbacks {
			when := f.When
			if len(when) == 0 {
				when = config.DefaultWhen
			}
			for _, w := range when {
				s.Fallbacks.WithLabelValues(r.Primary.Provider, f.Provider, w)
			}
		}
		if d := r.DegradeTo; d != nil {
			for _, w := range d.When {
				s.Fallbacks.WithLabelValues(r.Primary.Provider, d.Provider, w)
			}
		}
	}
	for _, t := range c.Tenants {
		s.TenantRequests.WithLabelValues(t.Name)
		for _, k := range []string{"input", "output", "cached", "reasoning"} {
			s.TenantTokens.WithLabelValues(t.Name, k)
		}
	}
}

// ConsumeRestarted counts a consume loop on stream started again, by why
// (mesh.Consumer.Restarted); nil on a nil Set.
func (s *Set) ConsumeRestarted(stream string) func(why string) {
	if s == nil {
		return nil
	}
	return func(why string) { s.ConsumeRestarts.WithLabelValues(stream, why).Inc() }
}
