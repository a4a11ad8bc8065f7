package admission

// laneCount counts a job admission sent to the batch lane (internal/lane).
func (s *Service) laneCount(provider, model string) {
	s.m.LaneJobs.WithLabelValues(provider, model, "diverted").Inc()
}
