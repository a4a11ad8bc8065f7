package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/version"
)

// newBuild makes, registers and sets sluice_build_info: which build
// (internal/version) a process runs, so a dashboard shows a fleet's
// versions side by side and a rollout's progress.
func (s *Set) newBuild(reg prometheus.Registerer) {
	s.BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_build_info",
		Help: "Always 1; its labels say which build this process runs: version (module version, the commit built, or the image's build argument), revision (the commit, \"\" when unknown) and go_version."},
		[]string{"version", "revision", "go_version"})
	reg.MustRegister(s.BuildInfo)
	v := version.Get()
	s.BuildInfo.WithLabelValues(v.Version, v.Revision, v.GoVersion).Set(1)
}
