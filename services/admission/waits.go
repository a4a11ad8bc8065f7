package admission

import (
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/task"
)

// Every gate that keeps a job from DISPATCH says why here, in one place:
// a job held in its model's queue asks the queue (why); a job sent back
// to QUEUE to wait (not_before, a retry's delay, a tenant's budget, a
// tenant's concurrency) is noted in waits when it is sent back, and the
// note is what "why" answers until the job comes back or the note is
// stale. A job handed to DISPATCH is the executors' (their own answer
// names the model's concurrency).

// waitBook owns what admission remembers of jobs it does not hold: why
// each job it sent back to QUEUE waits, and until when (waits), and which
// jobs their callers cancelled (cancel.go).
type waitBook struct {
	waits     map[string]waitNote  // job key -> why it waits in JetStream
	cancelled map[string]time.Time // job key -> when its caller cancelled it
}

// waitNote is why a job sent back to QUEUE waits, and until when.
type waitNote struct {
	reason string
	until  time.Time
}

// maxWaitNotes bounds the notes kept (a job beyond it waits unexplained
// here until it comes back).
const maxWaitNotes = 200_000

// noteWait records why the job of key waits in JetStream until until.
func (wb *waitBook) noteWait(key, reason string, until time.Time) {
	if _, ok := wb.waits[key]; ok || len(wb.waits) < maxWaitNotes {
		wb.waits[key] = waitNote{reason: reason, until: until}
	}
}

// forgetStaleWaits drops notes a minute past their end: the job came back
// to another process, or ended.
func (wb *waitBook) forgetStaleWaits(now time.Time) {
	for k, w := range wb.waits {
		if now.After(w.until.Add(time.Minute)) {
			delete(wb.waits, k)
		}
	}
}

// gateReason names a refusing gate's wait reason: its prefix and what
// bound (budget.Grant.Reason: rpm, tpm, burst); a day window's rpm and tpm
// are its rpd and tpd.
func gateReason(prefix, bound string) string {
	if day, ok := strings.CutSuffix(prefix, "day_"); ok {
		switch bound {
		case "rpm":
			bound = "rpd"
		case "tpm":
			bound = "tpd"
		}
		return day + bound
	}
	return prefix + bound
}

// notBeforeReason names why a job's not_before is in the future: the
// executor's reason when it sent the job back unsent (Requeued), a retry's
// backoff after a call, or the caller's own not_before.
func notBeforeReason(j *task.Task) string {
	if q := j.Requeued; q != nil && q.Calls == len(j.Attempts) {
		switch q.Reason {
		case "tenant_slot":
			return "tenant_concurrency"
		case "breaker_open", "deployment_down":
			return q.Reason
		}
	}
	if len(j.Attempts) > 0 {
		return "retry_backoff"
	}
	return "not_before"
}

// heldWaiting says why a job held in queue q waits: the queue's reason (the
// model's limit, cooldown, health); "fair_share" when the model is limited
// and other tenants' jobs share it (never how many: that is their load).
// Position is its place among its tenant's jobs held there. Until is
// when it and its tenant's jobs ahead of it are expected through at the
// model's request rate in effect and the tenant's weighted share, or the
// queue's next chance when that is later.
func (h *holder) heldWaiting(q *queueState, c *Candidate, now time.Time) *Waiting {
	tenant := c.Job.Tenant
	w := &Waiting{Reason: orQueued(q.reason), Until: q.wakeAt}
	w.Position = q.sched.PositionOf(tenant, c)
	share, others := q.sched.Share(tenant)
	if others && q.reason != "" {
		w.Reason, w.Limit = "fair_share", q.reason
	}
	rpm := 0
	for _, ms := range q.deps {
		if v, ok := h.placer.inEffect.Load(ms.key); ok {
			rpm += v.([2]int)[0]
		}
	}
	if rpm > 0 && q.reason != "" {
		perSec := float64(rpm) / 60 * share
		if est := now.Add(time.Duration(float64(w.Position) / perSec * float64(time.Second))); est.After(w.Until) {
			w.Until = est
		}
	}
	return w
}
