package ingest

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-dev/sluice/internal/task"
)

// ElectionWait bounds how long an HTTP submission waits for the streams and
// buckets to take it while leader elections run (a node lost: 6-10 s on
// loopback, longer on a loaded machine). Within it the caller sees only latency; past it, 503 with
// Retry-After. Retrying is safe: the job keeps its id, so its records are
// found again and QUEUE drops a second copy (the message id is the job's);
// a client retrying after a 503 should send an Idempotency-Key, which
// joins the first submission if it was taken after all.
const ElectionWait = 15 * time.Second

// electionAttempt bounds one try: a request sent to a leader that died is
// never answered, and each such try costs this much of ElectionWait.
const electionAttempt = 2 * time.Second

// acceptRiding is Accept, tried again with the same job (and so the same
// job id and message ids) while what refuses it is transient, for up to
// ElectionWait.
func (s *acceptor) acceptRiding(ctx context.Context, j *task.Task) (Accepted, error) {
	until := time.Now().Add(ElectionWait)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		actx, cancel := context.WithTimeout(ctx, electionAttempt)
		acc, err := s.accept(actx, j, false)
		cancel()
		var te *transientError
		if err == nil || !errors.As(err, &te) || ctx.Err() != nil || time.Now().Add(wait).After(until) {
			return acc, err
		}
		s.log.Debug("http submit: the streams are electing a leader; trying again", "job_id", j.ID, "err", err)
		select {
		case <-ctx.Done():
			return acc, err
		case <-time.After(wait):
		}
	}
}
