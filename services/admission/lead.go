package admission

import (
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/mesh"
)

// MinSendLead is the least lead a paced call is planned with, however fast
// the transit executors report.
const MinSendLead = time.Millisecond

// newLead makes the process's send-lead estimator: from the transits
// executors report, bounded by [MinSendLead, send_lead]; the slowest calls
// may be late by half the send tolerance, which leaves the other half for
// the jitter of the transit to the provider (ARCHITECTURE.md).
func newLead(a config.Admission) *budget.LeadEstimator {
	return budget.NewLeadEstimator(min(MinSendLead, a.SendLead.D()), a.SendLead.D(), a.SendTolerance.D()/2)
}

// watchTransits feeds the executors' transit reports to the estimator.
func (pl *placer) watchTransits() (*nats.Subscription, error) {
	bound := pl.app().Admission.SendLead.D()
	return pl.mesh.JS.Conn().Subscribe(mesh.TransitSubject, func(m *nats.Msg) {
		now := pl.now()
		for _, d := range mesh.DecodeTransits(m.Data, 2*bound) {
			pl.lead.Observe(now, d)
		}
	})
}

// blockGap is the widest spacing of the blocks taken for the demand
// expected in a slice: a job spends the first block at or after its own
// earliest instant, so it may wait up to the gap for it.
const blockGap = 10 * time.Millisecond

// demandBlocks splits the demand expected over spread into blocks at most
// blockGap apart, or none when it is too sparse to fill them: a job that
// finds no block then places itself at its earliest instant (one
// compare-and-set per admitted batch, at most spread/blockGap per spread),
// instead of waiting for a block planned tens of milliseconds ahead.
func demandBlocks(d budget.Cost, spread time.Duration) []budget.Cost {
	k := int(spread / blockGap)
	if d.Requests <= 0 || d.Tokens <= 0 || d.Requests < k {
		return nil
	}
	return piecesOf(d, k)
}
