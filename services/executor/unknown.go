package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// marks owns the operation record's in-flight state and the sent mark
// a call leaves in it: whether a call may be made again, and what becomes
// of one whose outcome was lost.
type marks struct {
	*env
	fin *finisher
	str *streamer
	fb  *feedback
}

// An attempt whose outcome is unknown (its executor lost after the call
// left, its answer cut after the headers) may have been completed, and
// billed, by the provider. It is called again only when that cannot pay
// twice: the provider honours the Idempotency-Key (configured, since
// OpenAI and Anthropic do not document it for completions), or the job
// opted in to at-least-once. Otherwise the job ends outcome_unknown, in
// the DLQ with its attempts, for an operator to replay by hand.
//
// To tell a call that never left from one that did, the operation record
// carries a mark (mesh.SentMark) written with the in-flight record, by
// compare-and-set, just before the call: every way out of an attempt that
// did not send withdraws it, every known outcome clears it. A delivery that
// finds a mark it did not write therefore finds a call that may have been
// made and whose outcome nobody recorded.

// mayCallAgain reports whether an attempt whose outcome is unknown may be
// sent again.
func (s *marks) mayCallAgain(j *task.Task) bool {
	if j.AtLeastOnce {
		return true
	}
	for _, p := range s.app().Providers {
		if p.Name == j.Provider {
			return p.HonoursIdempotencyKey
		}
	}
	return false
}

// newSentMark is the mark an execution of j writes before its call.
func (s *marks) newSentMark(j *task.Task, attempt int) *mesh.SentMark {
	m := &mesh.SentMark{Attempt: attempt, At: s.now().UTC(), By: s.holder + "." + job.NewID()[24:]}
	if j.Reservation != nil {
		m.Reservation = j.Reservation.ID
	}
	return m
}

// lostGrace is how long after its call's own bound an executor may still
// be recording the outcome (publishing the result through an election).
const lostGrace = resultPublishWait + 10*time.Second

// callBound is the longest a call of j, and the recording of its outcome,
// can take after it left.
func (s *marks) callBound(j *task.Task) time.Duration {
	d := 2 * time.Minute
	if p, _, ok := s.app().Deployment(j.Provider, j.Model); ok {
		d = p.Timeout.D()
	}
	return d + lostGrace
}

// redeliverAfter asks run to leave the message for a later delivery.
type redeliverAfter = mesh.RetryAfter

// lostCall handles a delivery of j that found an earlier attempt's call
// marked sent and its outcome unrecorded (mayCallAgain is false). A
// stored result settles it; a streamed job that relayed tokens ends from
// what STREAMS holds. Otherwise the executor that sent the call may still
// be at work (the message was redelivered while it waited for a slot, or
// its acknowledgements were lost in an election): until the call's bound
// has passed the job waits, and then it ends outcome_unknown without a
// second call.
func (s *marks) lostCall(ctx context.Context, j *task.Task, opKey string, sent *mesh.SentMark, stream bool) error {
	if _, err := s.mesh.StoredResult(ctx, j.Tenant, j.ID); err == nil {
		s.m.DupSuppressed.WithLabelValues(s.app().TaskLabel(j.Task)).Inc()
		return nil
	}
	if stream {
		// Past its first token a streamed job ends from what STREAMS
		// relayed (resume.go), at once, as a lost stream always has.
		if ended, err := s.str.resumeStream(ctx, j, opKey); ended {
			return err
		}
	}
	if wait := sent.At.Add(s.callBound(j)).Sub(s.now()); wait > 0 {
		s.log.Info("an earlier attempt's call left and its outcome is not recorded yet; waiting for it",
			"job_id", j.ID, "attempt", sent.Attempt, "wait", wait.Round(time.Second))
		return redeliverAfter(wait)
	}
	if j.Reservation != nil && j.Reservation.ID != sent.Reservation {
		// This delivery was admitted again after the lost call: its
		// reservation was never used.
		s.fb.returnUnusedTokens(ctx, j)
	}
	j.Attempts = append(j.Attempts, job.Attempt{N: sent.Attempt, Provider: j.Provider, Model: j.Model, StartedAt: sent.At,
		Outcome: dlq.ReasonOutcomeUnknown, Error: &job.Error{Code: "executor_lost", Message: "the executor making this call was lost before it recorded the outcome"}})
	return s.outcomeUnknown(ctx, j, opKey, "executor_lost")
}

// outcomeUnknown ends j outcome_unknown: a dead letter with its attempts,
// and a failed result saying so.
func (s *marks) outcomeUnknown(ctx context.Context, j *task.Task, opKey, reason string) error {
	s.m.OutcomeUnknown.WithLabelValues(j.Provider, j.Model, reason).Inc()
	s.log.Warn("outcome unknown: the job ends without calling the provider again", "job_id", j.ID,
		"provider", j.Provider, "model", j.Model, "reason", reason)
	return s.fin.terminal(ctx, j, opKey, job.StatusFailed, dlq.ReasonOutcomeUnknown, &job.Error{Code: dlq.ReasonOutcomeUnknown,
		Message: fmt.Sprintf("outcome unknown (%s): the provider may have completed, and billed, this request; Sluice does not call it again without an idempotency guarantee. An operator can replay it: sluice dlq replay --tenant %s %s", reason, j.Tenant, j.ID)})
}

// withdrawSent removes mark from the operation record if it is still
// there: the execution that wrote it did not send (or cannot tell, after
// an error writing it).
func (s *marks) withdrawSent(ctx context.Context, opKey string, mark *mesh.SentMark) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resultPublishWait)
	defer cancel()
	err := streams.Retry(ctx, func(ctx context.Context) error {
		_, err := s.mesh.UpdateOp(ctx, opKey, func(r *mesh.OpRecord) bool {
			if r.Sent == nil || r.Sent.By != mark.By {
				return false
			}
			r.Sent = nil
			return true
		})
		return err
	})
	if err != nil && !errors.Is(err, job.ErrNotFound) {
		s.log.Warn("could not withdraw a call's sent mark; a later delivery will take the call as made", "err", err)
	}
}

// resultPublishWait bounds how long a result (or another record of an
// outcome) is retried through a leader election before the executor gives
// up and leaves the message for redelivery.
const resultPublishWait = 20 * time.Second

// markInFlight marks the operation in flight for this attempt. With
// ingest's revision of the record (task.Revs), it writes the in-flight
// record by compare-and-set at that revision without reading it: a record
// still at the revision ingest created it at is queued, unjoined and not
// cancelled, and its key, job and tenant are the job's. Otherwise (no
// hint, or the record changed since) it reads and updates the record. It
// returns the record as written (or as found, when it is done or
// cancelled: then *cancelled says which) and its revision; *wasInFlight
// says an earlier attempt had marked it in flight and not settled it.
// The record written carries sent, the mark that this call leaves; a
// record that carries an earlier call's mark is left as it is and *lost
// is set to it, unless the call may be made again (mayCallAgain).
func (s *marks) markInFlight(ctx context.Context, j *task.Task, opKey string, attempt int, sent *mesh.SentMark, lost **mesh.SentMark, cancelled, wasInFlight *bool) (*mesh.OpRecord, uint64, error) {
	if j.Revs != nil && j.Revs.Op > 0 {
		_, key := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
		r := &mesh.OpRecord{Key: key, JobID: j.ID, Tenant: j.Tenant, State: mesh.OpInFlight, Provider: j.Provider, Model: j.Model, Attempt: attempt, Sent: sent,
			BodyDigest: mesh.BodyDigest(j), Trace: tracing.Traceparent(ctx)} // the job's trace, as ingest wrote it
		if rev, err := s.mesh.PutOpAt(ctx, opKey, r, j.Revs.Op); err == nil {
			return r, rev, nil
		}
		// Changed since, gone, or not known to be written: read it.
	}
	return s.mesh.UpdateOpRev(ctx, opKey, func(r *mesh.OpRecord) bool {
		if r.State == mesh.OpCompleted || r.State == mesh.OpFailed {
			return false
		}
		if r.Cancelled {
			*cancelled = true
			return false
		}
		if r.Sent != nil && r.Sent.By != sent.By && !s.mayCallAgain(j) {
			*lost = r.Sent // an earlier call left; see lostCall
			return false
		}
		*wasInFlight = r.State == mesh.OpInFlight
		r.State, r.Provider, r.Model, r.Attempt, r.Sent = mesh.OpInFlight, j.Provider, j.Model, attempt, sent
		return true
	})
}
