package metrics

import "github.com/prometheus/client_golang/prometheus"

// newDeployments makes and registers the metrics of a model's deployments
// (a model name several providers serve; label provider is the
// deployment's).
func (s *Set) newDeployments(reg prometheus.Registerer) {
	s.DeploymentPlaced = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_deployment_placed_total",
		Help: "Jobs admission placed on each deployment (provider) of a model."}, []string{"provider", "model"})
	s.DeploymentFill = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_deployment_fill",
		Help: "Share of a deployment's limit in effect the fleet used in the trailing minute (dimension: requests, tokens), as one admission process last read it."}, []string{"provider", "model", "dimension"})
	s.DeploymentCooldown = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_deployment_cooldown_until_seconds",
		Help: "Unix time until which the fleet skips a deployment (cooling after a 429 or Retry-After); -1 while it is skipped until a probe succeeds; 0 when it takes jobs."}, []string{"provider", "model"})
	s.BreakerState = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_breaker_state",
		Help: "A deployment's circuit breaker in this executor process at its last call: 0 closed, 1 half-open, 2 open."}, []string{"provider", "model"})
	s.AffinityJobs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_affinity_jobs_total",
		Help: "Jobs with an affinity key placed on a model group, by outcome: stayed on the deployment that served the key last, moved to another, or new (no deployment known). Share that stayed: stayed / (stayed + moved)."}, []string{"model", "outcome"})
	reg.MustRegister(s.DeploymentPlaced, s.DeploymentFill, s.DeploymentCooldown, s.BreakerState, s.AffinityJobs)
}
