package mesh

import (
	"encoding/json"
	"time"
)

// TransitSubject carries executors' dispatch transits to every admission
// process: how long paced calls took from being planned to being ready to
// send, deliberate waits taken out. Admission learns its send lead from
// them (internal/budget LeadEstimator).
const TransitSubject = "sluice.signal.transit"

// maxTransits bounds one report.
const maxTransits = 256

type transitReport struct {
	US []int64 `json:"us"` // microseconds
}

// PublishTransits reports transits (at most maxTransits; core NATS, no
// reply).
func (m *Mesh) PublishTransits(ds []time.Duration) error {
	r := transitReport{US: make([]int64, 0, min(len(ds), maxTransits))}
	for _, d := range ds[:min(len(ds), maxTransits)] {
		r.US = append(r.US, d.Microseconds())
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return m.JS.Conn().Publish(TransitSubject, data)
}

// DecodeTransits reads a report; what is not one yields nothing, and
// transits are bounded to [0, bound] whatever the sender claims.
func DecodeTransits(data []byte, bound time.Duration) []time.Duration {
	var r transitReport
	if json.Unmarshal(data, &r) != nil {
		return nil
	}
	out := make([]time.Duration, 0, min(len(r.US), maxTransits))
	for _, us := range r.US[:min(len(r.US), maxTransits)] {
		d := time.Duration(us) * time.Microsecond
		if us < 0 {
			d = 0
		}
		if us > bound.Microseconds() {
			d = bound
		}
		out = append(out, d)
	}
	return out
}
