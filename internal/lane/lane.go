// Package lane is what the batch lane shares between admission, which
// sends an eligible job to it (Divert), and the lane's collectors
// (services/lane), which read it: the LANE subjects, the keys of the lane's
// records in the budgets bucket and the records themselves. A job of
// priority batch whose model's lane is enabled and whose deadline is far
// enough away goes to its provider's Batch API at the batch price instead
// of the synchronous schedule (docs/CONFIG.md, "The batch lane").
package lane

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Prefix is the LANE stream's subjects: sluice.lane.<provider>.<model>.
const Prefix = "sluice.lane."

// Subject is the LANE subject of a deployment's lane jobs.
func Subject(provider, model string) string {
	return Prefix + provider + "." + job.ModelToken(model)
}

// Eligible finds the deployment whose batch lane j may take at now: a
// batch-priority job not marked NoLane, for chat completions, not
// streamed, with no deadline or one at least the lane's min_deadline away,
// on its pinned deployment or the first of its model's group with the lane
// enabled. A job of a tenant with a spend budget never is: the lane takes
// no spend hold, so its cost would be outside the budget.
func Eligible(c *config.Config, j *task.Task, now time.Time) (provider string, lane config.BatchLane, ok bool) {
	if j.Priority != job.Batch || j.NoLane || (j.Endpoint != "" && j.Endpoint != job.EndpointChat) || streamed(j.Request) || spendBudgeted(c, j.Tenant) {
		return "", lane, false
	}
	for _, d := range c.Group(j.Model) {
		if j.Provider != "" && d.Provider.Name != j.Provider {
			continue
		}
		l, on := d.Model.Lane()
		if !on {
			continue
		}
		if j.Deadline != nil && j.Deadline.Sub(now) < l.MinDeadline.D() {
			return "", lane, false
		}
		return d.Provider.Name, l, true
	}
	return "", lane, false
}

// Kept reports whether a job of tenant for model (as the job names it),
// collected in provider's lane, may still go in a batch under c: its tenant has no spend budget
// and the deployment's lane is on. A reload can change either while the
// job waits to be collected.
func Kept(c *config.Config, tenant, provider, model string) bool {
	if spendBudgeted(c, tenant) {
		return false
	}
	for _, d := range c.Group(model) {
		if _, on := d.Model.Lane(); on && d.Provider.Name == provider {
			return true
		}
	}
	return false
}

// spendBudgeted reports whether tenant has a spend budget (tenants[].spend
// with a cap).
func spendBudgeted(c *config.Config, tenant string) bool {
	t, ok := c.Tenant(tenant)
	return ok && t.Spend != nil && (t.Spend.PerDay > 0 || t.Spend.PerMonth > 0)
}

func streamed(body []byte) bool {
	var f struct {
		Stream bool `json:"stream"`
	}
	return json.Unmarshal(body, &f) == nil && f.Stream
}

// Divert sends j, read from QUEUE as msg, to its deployment's lane when it
// is eligible (Eligible) and reports whether it did: published to LANE
// with a message id that dedupes a redelivery's, then msg acknowledged.
// A publish that fails leaves the job to the normal lane.
func Divert(ctx context.Context, js jetstream.JetStream, c *config.Config, msg jetstream.Msg, j *task.Task, now time.Time, count func(provider, model string)) bool {
	provider, _, ok := Eligible(c, j, now)
	if !ok {
		return false
	}
	data, err := json.Marshal(j)
	if err != nil {
		return false
	}
	m := nats.NewMsg(Subject(provider, j.Model))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, keys.MsgID(MsgLane, j.Tenant, j.ID, seqOf(msg)))
	if _, err := js.PublishMsg(ctx, m); err != nil {
		return false
	}
	_ = msg.Ack()
	if count != nil {
		count(provider, j.Model)
	}
	return true
}

// MsgLane is the message id kind of a job sent to LANE; its seq is the
// QUEUE delivery's stream sequence.
const MsgLane keys.Msg = "lane"

func seqOf(msg jetstream.Msg) string {
	md, err := msg.Metadata()
	if err != nil {
		return ""
	}
	return fmt.Sprint(md.Sequence.Stream)
}
