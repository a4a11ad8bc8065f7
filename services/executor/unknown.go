package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

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
func (s *Service) mayCallAgain(j *task.Task) bool {
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
func (s *Service) newSentMark(j *task.Task, attempt int) *mesh.SentMark {
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
func (s *Service) callBound(j *task.Task) time.Duration {
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
func (s *Service) lostCall(ctx context.Context, j *task.Task, opKey string, sent *mesh.SentMark, stream bool) error {
	if _, err := s.mesh.StoredResult(ctx, j.Tenant, j.ID); err == nil {
		s.m.DupSuppressed.WithLabelValues(s.app().TaskLabel(j.Task)).Inc()
		return nil
	}
	if stream {
		// Past its first token a streamed job ends from what STREAMS
		// relayed (resume.go), at once, as a lost stream always has.
		if ended, err := s.resumeStream(ctx, j, opKey); ended {
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
		s.returnUnusedTokens(ctx, j)
	}
	j.Attempts = append(j.Attempts, job.Attempt{N: sent.Attempt, Provider: j.Provider, Model: j.Model, StartedAt: sent.At,
		Outcome: dlq.ReasonOutcomeUnknown, Error: &job.Error{Code: "executor_lost", Message: "the executor making this call was lost before it recorded the outcome"}})
	return s.outcomeUnknown(ctx, j, opKey, "executor_lost")
}

// outcomeUnknown ends j outcome_unknown: a dead letter with its attempts,
// and a failed result saying so.
func (s *Service) outcomeUnknown(ctx context.Context, j *task.Task, opKey, reason string) error {
	s.m.OutcomeUnknown.WithLabelValues(j.Provider, j.Model, reason).Inc()
	s.log.Warn("outcome unknown: the job ends without calling the provider again", "job_id", j.ID,
		"provider", j.Provider, "model", j.Model, "reason", reason)
	return s.terminal(ctx, j, opKey, job.StatusFailed, dlq.ReasonOutcomeUnknown, &job.Error{Code: dlq.ReasonOutcomeUnknown,
		Message: fmt.Sprintf("outcome unknown (%s): the provider may have completed, and billed, this request; Sluice does not call it again without an idempotency guarantee. An operator can replay it: sluice dlq replay --tenant %s %s", reason, j.Tenant, j.ID)})
}

// withdrawSent removes mark from the operation record if it is still
// there: the execution that wrote it did not send (or cannot tell, after
// an error writing it).
func (s *Service) withdrawSent(ctx context.Context, opKey string, mark *mesh.SentMark) {
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
