package admission

import (
	"time"
)

// HeldMax bounds how long a model's held jobs wait in this process while
// it dispatches none of them (and the provider asked for no pause): past
// it they go back to QUEUE, for whichever admission process can place them.
// Budget that frees, a store that recovers or a scheduler that lost track
// of a job: whatever kept them, a job is dispatched or given back within
// HeldMax and a quarter. A job held HeldMax*4 goes back even while its
// model dispatches others.
const HeldMax = time.Minute

// watchHeld reports the age of the oldest job held here
// (sluice_held_oldest_seconds) and gives back what waited too long.
func (h *holder) watchHeld() {
	now := h.now()
	limit := h.heldMax
	oldest := time.Duration(0)
	for _, q := range h.queues {
		n, _ := q.sched.Len()
		if n == 0 {
			q.progressAt = now
			continue
		}
		stalled := now.Sub(q.progressAt) >= limit && !h.placer.paused(q, now)
		gone := q.sched.Remove(func(it *Item) bool {
			age := now.Sub(it.Since)
			if stalled && age >= limit || age >= 4*limit {
				return true
			}
			oldest = max(oldest, age)
			return false
		})
		for _, it := range gone {
			h.held.remove(it)
			c := it.Value.(*Candidate)
			h.m.AdmissionWaits.WithLabelValues(c.Job.Provider, c.Job.Model, "held_too_long").Inc()
			_ = c.Msg.NakWithDelay(jitter(time.Second))
		}
		if len(gone) > 0 {
			h.log.Warn("held jobs waited too long without a dispatch; giving them back to the queue",
				"queue", q.key, "jobs", len(gone), "reason", orQueued(q.reason), "model_stalled", stalled)
			q.wakeAt, q.progressAt = time.Time{}, now
		}
	}
	h.m.HeldOldest.Set(oldest.Seconds())
}

// paused reports whether the provider asked the fleet to hold every
// deployment q may place on: health cools each after its Retry-After
// (verdict), its wait or its probe not over.
func (pl *placer) paused(q *queueState, now time.Time) bool {
	for _, ms := range q.deps {
		if v, blocked := pl.verdict(ms, now); !blocked || v.reason != reasonPaused {
			return false
		}
	}
	return true
}
