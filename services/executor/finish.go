package executor

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// finisher owns publishing a job's terminal result: it fills in what
// every result carries (job, tenant, attempts, deployment, price), ends a
// streamed job's stream subject, stores a cacheable answer, writes the
// dead-letter entry first for a job a call failed (terminal), and
// publishes through the mesh's one finish (mesh.Finish).
type finisher struct {
	*env
	ended      sync.Map // job id -> true: its stream's end marker is published
	firstToken sync.Map // job key -> time.Duration: its stream's time to first token (request log)
}

func (s *finisher) finish(ctx context.Context, j *task.Task, opKey string, r *mesh.Outcome) error {
	return s.finishHinted(ctx, j, opKey, r, nil, 0)
}

// finishHinted is finish; inFlight (at opRev) is the operation record as
// this attempt wrote it, passed on to the result service so it can settle
// the record without reading it (nil: not known).
func (s *finisher) finishHinted(ctx context.Context, j *task.Task, opKey string, r *mesh.Outcome, inFlight *mesh.OpRecord, opRev uint64) error {
	if _, ended := s.ended.LoadAndDelete(j.Key()); !ended && r.Status != job.StatusSucceeded {
		if stream, _ := streamed(j); stream {
			// A streamed job that ends before its first token: its stream
			// subject says so too, for NATS readers.
			newChunkPublisher(s.mesh.JS, j, 0, s.now, nil).end(r.Status, r.Error)
		}
	}
	if len(r.Response) > s.app().Limits.MaxResponseBytes {
		r.Status, r.Response, r.Error = job.StatusFailed, nil, s.tooLarge()
	}
	hints := mesh.ResultHints{Op: inFlight, OpRev: opRev, Facts: mesh.FactsOf(j)}
	if ttft, ok := s.firstToken.LoadAndDelete(j.Key()); ok {
		hints.Facts.TTFTMS = ttft.(time.Duration).Milliseconds()
	}
	if j.Revs != nil {
		hints.RecordRev = j.Revs.Record
	}
	// Whatever the sizes agreed at start, an answer that cannot be stored
	// must not be redelivered: each delivery would pay again (TooLarge).
	_, err := s.mesh.Finish(ctx, j, *r, mesh.Exit{OpKey: opKey, Hints: hints, Price: s.app(), Wait: resultPublishWait, TooLarge: s.tooLarge(),
		Before: func(res *job.Result) { s.storeAnswer(ctx, j, res) }})
	return err
}

// terminal ends a job that a provider call failed: the dead-letter entry
// (reason, last error, attempt history) first, then the result.
func (s *finisher) terminal(ctx context.Context, j *task.Task, opKey string, status job.Status, reason string, e *job.Error) error {
	if err := dlq.Publish(ctx, s.mesh.JS, &dlq.Entry{Job: *j, Reason: reason, LastError: e, DeadAt: s.now().UTC()}); err != nil {
		return fmt.Errorf("dead-letter %s: %w", j.ID, err)
	}
	s.m.DeadLetters.WithLabelValues(reason).Inc()
	return s.finish(ctx, j, opKey, &mesh.Outcome{Status: status, Error: e})
}

func (s *finisher) tooLarge() *job.Error {
	return &job.Error{Code: job.CodeResponseTooLarge, Message: fmt.Sprintf(
		"the provider's answer is larger than limits.max_response_bytes (%d bytes): it was paid for once and is not stored, and the call is not repeated; raise the limit or ask for less output",
		s.app().Limits.MaxResponseBytes)}
}

// storeAnswer keeps a job's answer in the response cache when ingest gave
// the job a cache target (the cache checks that it is a complete answer).
// It runs before the result is published, so a request that follows the
// result finds the entry; the answer is delivered whether or not it is
// stored.
func (s *finisher) storeAnswer(ctx context.Context, j *task.Task, r *job.Result) {
	if s.cfg.Cache == nil || j.CacheTarget == nil {
		return
	}
	s.cfg.Cache.Store(context.WithoutCancel(ctx), s.app(), j.Tenant, j.CacheTarget, r)
}
