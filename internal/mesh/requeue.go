package mesh

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/task"
)

// Reason is why a job goes to QUEUE: ingest accepting it, or a service
// sending it back to admission. Each has its own message-id kind, so that
// a repeat of one send (a crash between publish and acknowledgement) is
// deduplicated while a send for another reason is not.
type Reason string

// The reasons. Those the executor bounds (internal to it: how many returns
// in a row before a job is dead-lettered) are its metric labels too.
const (
	Accepted       Reason = "accepted"        // ingest accepted the job; seq: none
	Retried        Reason = "retry"           // an attempt failed and is retried; seq: the attempt
	RateLimited    Reason = "rate_limited"    // the provider throttled it; seq: the count of throttles
	Unverified     Reason = "unverified"      // its reservation does not verify; seq: its DISPATCH delivery
	Lapsed         Reason = "lapsed"          // its reservation lapsed before it was sent; seq: as above
	TenantSlot     Reason = "tenant_slot"     // its tenant's concurrency refused it; seq: as above
	BreakerOpen    Reason = "breaker_open"    // its model's breaker is open; seq: as above
	DeploymentDown Reason = "deployment_down" // its deployment is down, to be placed again; seq: as above
	Drained        Reason = "drained"         // taken while its executor drains; seq: as above
	Fallback       Reason = "fallback"        // moved to its fallback model; seq: as above
	LaneSync       Reason = "lane_sync"       // left its batch lane for the normal one; seq: its LANE message
)

// queueKinds is the message-id kind of each reason.
var queueKinds = map[Reason]keys.Msg{
	Accepted:       keys.MsgQueued,
	Retried:        keys.MsgRetry,
	RateLimited:    keys.MsgRateLimited,
	Unverified:     keys.MsgUnverified,
	Lapsed:         keys.MsgReadmit,
	TenantSlot:     keys.MsgTenantSlot,
	BreakerOpen:    keys.MsgBreaker,
	DeploymentDown: keys.MsgDown,
	Drained:        keys.MsgDrain,
	Fallback:       keys.MsgFallback,
	LaneSync:       keys.MsgLaneSync,
}

// QueueMsgID is the message id of j's send to QUEUE for why, seq telling
// it from another send for the same reason; false for a reason there is
// none of.
func QueueMsgID(j *task.Task, why Reason, seq string) (string, bool) {
	kind, ok := queueKinds[why]
	if !ok {
		return "", false
	}
	return keys.MsgID(kind, j.Tenant, j.ID, seq), true
}

// Requeue sends j to QUEUE for why: the one way a job goes (back) to
// admission.
func (m *Mesh) Requeue(ctx context.Context, j *task.Task, why Reason, seq string) error {
	id, ok := QueueMsgID(j, why, seq)
	if !ok {
		return fmt.Errorf("requeue %s: no such reason %q", j.ID, why)
	}
	return m.enqueue(ctx, j, id)
}
