package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// requeuer owns sending a job back to admission without a call: its
// operation queued again, its reservation dropped, its run of returns for
// one reason bounded (requeue).
type requeuer struct {
	*env
	fin *finisher
	fb  *feedback // an unsent paced call's instant goes back (notSent)
}

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

// requeueOp marks an operation that was about to be called queued again
// (it goes back to admission instead); a missing record is fine.
func (s *requeuer) requeueOp(ctx context.Context, opKey string, j *task.Task, why string) {
	if _, err := s.mesh.UpdateOp(ctx, opKey, func(r *mesh.OpRecord) bool {
		if r.State != mesh.OpInFlight {
			return false
		}
		r.State, r.Sent = mesh.OpQueued, nil
		return true
	}); err != nil && !errors.Is(err, job.ErrNotFound) {
		s.log.Debug(why+": op record", "job_id", j.ID, "err", err)
	}
}

// requeue sends j, taken from msg, back to admission for r without its
// reservation, or dead-letters it when that would make more than r.bound
// returns in a row for r.
func (s *requeuer) requeue(ctx context.Context, msg jetstream.Msg, j *task.Task, opKey string, r backReason) error {
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
		return s.fin.terminal(ctx, j, opKey, job.StatusDeadLettered, job.CodeRequeueLimit, &job.Error{Code: job.CodeRequeueLimit,
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

// backToAdmission sends a job that was not called back to admission
// without its reservation, not before notBefore (nil: its not_before
// stays as it is); its operation is queued again.
func (s *requeuer) backToAdmission(ctx context.Context, a *attempt, notBefore *time.Time, why string, r backReason) error {
	j := a.j
	if notBefore != nil {
		nb := notBefore.UTC()
		j.NotBefore = &nb
	}
	s.requeueOp(ctx, a.opKey, j, why)
	return s.requeue(ctx, a.msg, j, a.opKey, r)
}

// notSent sends back to admission a job whose call did not leave: its
// reservation lapsed before the call, it woke past its instant's
// tolerance, or its connection came after the instant it had to leave by.
// The provider never saw it, so its instant goes back to the model's
// schedule (giveBackUnsent).
func (s *requeuer) notSent(ctx context.Context, a *attempt) error {
	a.ticket.Release()
	if a.claimed {
		s.requeueOp(ctx, a.opKey, a.j, "late send")
	}
	s.fb.giveBackUnsent(ctx, a.msg, a.j)
	s.m.ReservationsExpired.WithLabelValues(a.j.Provider, a.j.Model).Inc()
	if r := a.j.Reservation; r != nil && s.log.Enabled(ctx, slog.LevelDebug) {
		// Why: a transit longer than the lead, or a late wake-up.
		now := s.now()
		s.log.Debug("reservation lapsed: sent back to admission", "job_id", a.j.ID, "claimed", a.claimed,
			"late", now.Sub(r.ValidUntil), "transit", now.Sub(r.ReservedAt), "lead", r.SendAt.Sub(r.ReservedAt), "in_executor", now.Sub(a.at))
	}
	return s.requeue(ctx, a.msg, a.j, a.opKey, backLapsed)
}
