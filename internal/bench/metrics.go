package bench

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// SluiceMetrics is what the Sluice fleet's own metrics said during a run:
// the limits admission paced against and what it learned from 429s.
type SluiceMetrics struct {
	// Nodes is how many in-process nodes the fleet had.
	Nodes int `json:"nodes"`
	// Effective is sluice_limit_effective at the run's end, by dimension
	// (requests_per_minute, tokens_per_minute, requests_per_second,
	// tokens_per_second; 0 = unlimited), as the first admission process
	// that reported it computed it.
	Effective map[string]float64 `json:"limit_effective,omitempty"`
	// Samples are the same limits every 5 s of the run.
	Samples []LimitSample `json:"limit_effective_samples,omitempty"`
	// Cuts is sluice_limit_cuts_total by reason, summed over the nodes.
	Cuts map[string]float64 `json:"limit_cuts,omitempty"`
	// RateLimitHits is llm_rate_limit_hits_total by limit type: the 429s
	// the executors saw, as Sluice classified them.
	RateLimitHits map[string]float64 `json:"rate_limit_hits,omitempty"`
	// Requeues is sluice_rate_limit_requeues_total by outcome.
	Requeues map[string]float64 `json:"rate_limit_requeues,omitempty"`
	// Deferrals is sluice_admission_deferrals_total by reason: jobs
	// admission sent back to wait for room.
	Deferrals map[string]float64 `json:"admission_deferrals,omitempty"`
	// ReservationsExpired is sluice_reservations_expired_total.
	ReservationsExpired float64 `json:"reservations_expired"`
	// All is every non-zero sluice_* and llm_* series of the fleet at the
	// run's end, as name{label="value",…} (provider and model labels left
	// out): counters summed over the nodes, gauges the largest node's,
	// histograms as their summed _count and _sum.
	All map[string]float64 `json:"all,omitempty"`
}

// LimitSample is sluice_limit_effective at one instant of a run.
type LimitSample struct {
	AtS    float64            `json:"at_s"`
	Limits map[string]float64 `json:"limits"`
}

const (
	metricEffective = "sluice_limit_effective"
	metricCuts      = "sluice_limit_cuts_total"
	metricHits      = "llm_rate_limit_hits_total"
	metricRequeues  = "sluice_rate_limit_requeues_total"
	metricExpired   = "sluice_reservations_expired_total"
	metricDeferrals = "sluice_admission_deferrals_total"
)

// gathered is the metric families of the benchmark model, one map per node.
type gathered []map[string]*dto.MetricFamily

func gather(regs []*prometheus.Registry) gathered {
	var out gathered
	for _, r := range regs {
		fams, err := r.Gather()
		if err != nil && len(fams) == 0 {
			continue
		}
		m := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			m[f.GetName()] = f
		}
		out = append(out, m)
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

// sum adds up family name's non-zero values for the benchmark model over
// every node, by the value of label by ("" = one total under "").
func (g gathered) sum(name, by string) map[string]float64 {
	out := map[string]float64{}
	for _, node := range g {
		f := node[name]
		if f == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "model") != Model || value(m) == 0 {
				continue
			}
			out[label(m, by)] += value(m)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// first returns family name's values for the benchmark model by label by,
// from the first node that has any.
func (g gathered) first(name, by string) map[string]float64 {
	for _, node := range g {
		f := node[name]
		if f == nil {
			continue
		}
		out := map[string]float64{}
		for _, m := range f.GetMetric() {
			if label(m, "model") == Model {
				out[label(m, by)] = value(m)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

func (s *SluiceMetrics) sample(regs []*prometheus.Registry, at float64) {
	if eff := gather(regs).first(metricEffective, "dimension"); eff != nil {
		s.Samples = append(s.Samples, LimitSample{AtS: at, Limits: eff})
	}
}

func (s *SluiceMetrics) finish(regs []*prometheus.Registry, at float64) {
	g := gather(regs)
	s.Effective = g.first(metricEffective, "dimension")
	if s.Effective != nil {
		s.Samples = append(s.Samples, LimitSample{AtS: at, Limits: maps.Clone(s.Effective)})
	}
	s.Cuts = g.sum(metricCuts, "reason")
	s.RateLimitHits = g.sum(metricHits, "limit_type")
	s.Requeues = g.sum(metricRequeues, "outcome")
	s.Deferrals = g.sum(metricDeferrals, "reason")
	s.ReservationsExpired = g.sum(metricExpired, "")[""]
	s.All = g.all()
}

// all collects every non-zero sluice_* and llm_* series over the nodes.
func (g gathered) all() map[string]float64 {
	out := map[string]float64{}
	for _, node := range g {
		for name, f := range node {
			if !strings.HasPrefix(name, "sluice_") && !strings.HasPrefix(name, "llm_") {
				continue
			}
			for _, m := range f.GetMetric() {
				if mod := label(m, "model"); mod != "" && mod != Model {
					continue
				}
				var labels []string
				for _, l := range m.GetLabel() {
					if l.GetName() != "provider" && l.GetName() != "model" {
						labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
					}
				}
				key := name
				if len(labels) > 0 {
					key += "{" + strings.Join(labels, ",") + "}"
				}
				if h := m.GetHistogram(); h != nil {
					if h.GetSampleCount() > 0 {
						out[key+"_count"] += float64(h.GetSampleCount())
						out[key+"_sum"] += h.GetSampleSum()
					}
					continue
				}
				switch v := value(m); {
				case v == 0:
				case m.GetGauge() != nil:
					out[key] = max(out[key], v) // a gauge is per process: the largest
				default:
					out[key] += v
				}
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
