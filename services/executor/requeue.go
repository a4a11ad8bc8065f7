package executor

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Every way a job goes back to admission without a provider call passes
// through requeue. It counts the run of returns for one reason (reset by a
// call, or by another reason); a job that comes back more than its
// reason's bound is dead-lettered (requeue_limit) with a warning in the
// log, so no job loops silently between admission and the executors.
// Returns after a call (a retry, a 429) are bounded by the retry policy
// and admission.max_rate_limited, not here.

// backReason is why a job goes back to admission unsent.
type backReason struct {
	name  string // its mesh.Reason: the metric label and the job's Requeued.Reason
	bound int    // returns in a row for this reason, without a call, before the job ends
}

// The reasons. A reservation that does not verify is Sluice's own fault:
// a few tries. The others wait for something that normally comes (an
// instant the executors kept up with, a tenant slot, a breaker's probe, a
// drain's end); their bounds are far above any normal run of them.
var (
	backUnverified = backReason{string(mesh.Unverified), 3}
	// A lapse is also a wait for a concurrency slot a crashed process
	// still leases (until its lease ends): a fast re-placement (no lead
	// with room) makes many in that time.
	backLapsed     = backReason{string(mesh.Lapsed), 1200}
	backTenantSlot = backReason{string(mesh.TenantSlot), 1200} // 5 min of TenantSlotWait
	backBreaker    = backReason{string(mesh.BreakerOpen), 100}
	backDown       = backReason{string(mesh.DeploymentDown), 100}
	backDrain      = backReason{string(mesh.Drained), 20}
	backFallback   = backReason{string(mesh.Fallback), 10}
)

// requeue sends j, taken from msg, back to admission for r without its
// reservation, or dead-letters it when that would make more than r.bound
// returns in a row for r.
func (s *Service) requeue(ctx context.Context, msg jetstream.Msg, j *task.Task, opKey string, r backReason) error {
	n := 1
	if q := j.Requeued; q != nil && q.Reason == r.name && q.Calls == len(j.Attempts) {
		n = q.N + 1
	}
	s.m.Requeues.WithLabelValues(j.Provider, j.Model, r.name).Inc()
	if n > r.bound {
		s.m.RequeueLimited.WithLabelValues(j.Provider, j.Model, r.name).Inc()
		s.log.Warn("job sent back to admission too often for one reason: dead-lettered", "job_id", j.ID, "tenant", j.Tenant,
			"provider", clip.String(j.Provider, 64), "model", clip.String(j.Model, 64), "reason", r.name, "times", r.bound)
		j.Requeued = nil
		return s.terminal(ctx, j, opKey, job.StatusDeadLettered, job.CodeRequeueLimit, &job.Error{Code: job.CodeRequeueLimit,
			Message: fmt.Sprintf("sent back to admission %d times in a row (%s) without a provider call", r.bound, r.name)})
	}
	if n == r.bound/2 {
		s.log.Warn("job keeps going back to admission for one reason", "job_id", j.ID, "tenant", j.Tenant,
			"provider", clip.String(j.Provider, 64), "model", clip.String(j.Model, 64), "reason", r.name, "times", n, "ends_after", r.bound)
	}
	j.Requeued = &task.Requeued{Reason: r.name, N: n, Calls: len(j.Attempts)}
	j.Reservation = nil
	return s.mesh.Requeue(ctx, j, mesh.Reason(r.name), dispatchSeq(msg))
}
