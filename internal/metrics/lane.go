package metrics

import "github.com/prometheus/client_golang/prometheus"

// newLane makes and registers the batch lane's metrics (services/lane).
func (s *Set) newLane(reg prometheus.Registerer) {
	s.LaneJobs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_lane_jobs_total",
		Help: "Jobs of the batch lane by outcome: diverted (admission sent it to the lane), batch (its result came from a batch line), sync (sent back to the normal lane), failed (ended by its line's error)."}, []string{"provider", "model", "outcome"})
	s.LaneBatches = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_lane_batches_total",
		Help: "Batches by what became of them: submitted, ended, rescued (cancelled before a deadline), refused (the provider's enqueued-token or queue limit: the jobs wait), failed, unknown (a create whose outcome was never learned)."}, []string{"provider", "model", "state"})
	s.LaneOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_lane_open_batches",
		Help: "Batches this process owns that have not ended."}, []string{"provider", "model"})
	s.LaneLines = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_lane_lines_total",
		Help: "Batch lines by outcome: succeeded, errored, expired, cancelled."}, []string{"provider", "model", "outcome"})
	s.LaneEnqueued = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_lane_enqueued",
		Help: "The batch budget in use as this process last wrote it (unit: tokens for OpenAI's enqueued-token limit, requests for Anthropic's processing queue) and its limit (kind: used, limit; a limit of 0 is none)."}, []string{"provider", "model", "unit", "kind"})
	s.LaneWaits = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_lane_waits_total",
		Help: "Times a model's collected jobs waited because the batch budget (or the provider's refusal) had no room."}, []string{"provider", "model"})
	s.LaneSaved = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_lane_saved_cost_total",
		Help: "What the batch lane's results cost less than the same usage at the synchronous price, in the configured currency (priced models only)."}, []string{"provider", "model"})
	reg.MustRegister(s.LaneJobs, s.LaneBatches, s.LaneOpen, s.LaneLines, s.LaneEnqueued, s.LaneWaits, s.LaneSaved)
}
