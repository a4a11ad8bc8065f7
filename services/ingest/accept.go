package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// The phases of accept, in order: check the job against the configuration,
// admit it against the queue's pressure, stamp it, record it (or join the
// job already recorded for its operation), enqueue it.

// check validates j on its own and against the configuration: its
// envelope, tenant, model and endpoint, and its estimated cost against
// every limit it can never fit under. Nothing is written.
func (s *acceptor) check(j *task.Task) (*config.Provider, *config.Model, job.Estimate, error) {
	// j came from a producer's envelope (task.New of a job.Job): nothing
	// Sluice sets can have come from the producer but the deployment it
	// pins (deployments.go).
	pin := j.Provider
	// The request body is parsed and checked once, by the token estimate
	// below (the same checks as job.Check).
	if err := j.CheckEnvelope(); err != nil {
		return nil, nil, job.Estimate{}, err
	}
	if _, ok := s.app().Tenant(j.Tenant); !ok {
		return nil, nil, job.Estimate{}, &job.ValidationError{Code: job.CodeUnknownTenant, Field: "tenant", Message: fmt.Sprintf("unknown tenant %q", clip.String(j.Tenant, 64))}
	}
	name, est, err := tokens.Estimate(j.Endpoint, j.Request, s.lim, s.app().Limits.DefaultMaxTokens)
	if err != nil {
		return nil, nil, job.Estimate{}, err
	}
	prov, model, err := s.deployment(j, name, pin)
	if err != nil {
		return nil, nil, job.Estimate{}, err
	}
	if err := endpointServed(j, prov); err != nil {
		return nil, nil, job.Estimate{}, err
	}
	if err := shapeBody(j, prov, model, s.app().Limits.DefaultMaxTokens); err != nil {
		return nil, nil, job.Estimate{}, err
	}
	if err := s.fitsGroup(j, model, &est); err != nil {
		return nil, nil, job.Estimate{}, err
	}
	s.affinity(j, name)
	return prov, model, est, nil
}

// fits refuses a job whose cost is above a limit it could never fit
// under (the model's per-minute and per-day limits, the tenant's), and
// resolves its stated unit costs into est.Units.
func (s *acceptor) fits(j *task.Task, model *config.Model, est *job.Estimate) error {
	if model.TPM > 0 && est.Cost() > model.TPM {
		return &job.ValidationError{Code: job.CodeTooLarge, Field: "request",
			Message: fmt.Sprintf("needs %d tokens (%d prompt + %d max output), above the model's limit of %d tokens per minute", est.Cost(), est.PromptTokens, est.MaxTokens, model.TPM)}
	}
	if err := splitTooLarge(*est, model); err != nil { // anthropic.go
		return err
	}
	if model.TPD > 0 && est.Cost() > model.TPD {
		return &job.ValidationError{Code: job.CodeTooLarge, Field: "request",
			Message: fmt.Sprintf("needs %d tokens (%d prompt + %d max output), above the model's quota of %d tokens per day", est.Cost(), est.PromptTokens, est.MaxTokens, model.TPD)}
	}
	var err error
	if est.Units, err = guard.UnitCost(j.Cost, model, true); err != nil {
		return err
	}
	if t, _ := s.app().Tenant(j.Tenant); t != nil {
		for _, l := range []struct {
			name  string
			limit int
		}{{"tokens per minute", t.TPM}, {"tokens per day", t.TPD}} {
			if l.limit > 0 && est.Cost() > l.limit {
				return &job.ValidationError{Code: job.CodeTooLarge, Field: "request",
					Message: fmt.Sprintf("needs %d tokens, above the tenant's limit of %d %s", est.Cost(), l.limit, l.name)}
			}
		}
	}
	return nil
}

// room is what admit learned of the queue ahead, for a refusal later on.
type room struct {
	retry time.Duration // the wait to suggest to a producer QUEUE refuses
	ahead uint64        // the jobs waiting in QUEUE, as last read
}

// admit refuses a job the queue ahead makes late (its deadline cannot be
// met), sheds lower priorities as QUEUE fills, and applies the tenant's
// share of QUEUE.
func (s *acceptor) admit(ctx context.Context, j *task.Task, model *config.Model, cost int, now time.Time) (room, error) {
	if j.Deadline != nil && !j.Deadline.After(now) {
		return room{}, &job.ValidationError{Code: job.CodeDeadlineExpired, Field: "deadline", Message: "is already past"}
	}
	fill, wait, retry, ahead := s.queue.pressure(ctx, model, cost)
	if j.Deadline != nil && now.Add(wait).After(*j.Deadline) {
		return room{}, &job.ValidationError{Code: CodeDeadlineUnmeetable, Field: "deadline",
			Message: fmt.Sprintf("cannot be met: the estimated wait is %s (the queue ahead at %s's admission rate) and the deadline is in %s", wait.Round(100*time.Millisecond), model.Name, j.Deadline.Sub(now).Round(100*time.Millisecond))}
	}
	shed := s.app().Admission.Shed
	if (j.Priority == job.Batch && fill >= shed.Batch) || (j.Priority == job.Standard && fill >= shed.Standard) {
		s.m.Shed.WithLabelValues(j.Tenant, string(j.Priority)).Inc()
		return room{}, &BusyError{Code: "shed", RetryAfter: retry, Ahead: ahead,
			Message: fmt.Sprintf("the queue is %.0f%% full; %s work is deferred until it drains", 100*fill, j.Priority)}
	}
	if err := s.queueRoom(ctx, j, model, cost); err != nil {
		return room{}, err
	}
	return room{retry: retry, ahead: ahead}, nil
}

// stamp sets what Sluice decides about an accepted job (its id, time,
// route and estimate) and seals it.
func (s *acceptor) stamp(j *task.Task, prov *config.Provider, model *config.Model, est job.Estimate, now time.Time) {
	if j.ID == "" {
		j.ID = job.NewID()
	}
	j.SubmittedAt = now
	j.Provider, j.Model, j.Estimate = prov.Name, model.Name, &est
	j.Request = canonicalBody(j.Request) // what the seal and the digest bind
	s.cfg.Guard.Seal(j)
}

// record writes the job's two records at once (one round trip, not two):
// the job record, created once (a repeat of the same job id, a redelivered
// intake message or a client retrying its POST, continues where it
// stopped), and the operation record, which a different job with the
// same idempotency key joins. A non-nil joined ends accept there: the job
// was already finished, or it joined another.
func (s *acceptor) record(ctx context.Context, j *task.Task, held bool, now time.Time) (opKey string, made created, joined *Accepted, err error) {
	opKey, key := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	op := mesh.OpRecord{Key: key, JobID: j.ID, Tenant: j.Tenant, State: mesh.OpQueued, Provider: j.Provider, Model: j.Model, UpdatedAt: now,
		BodyDigest: mesh.BodyDigest(j), Trace: tracing.Traceparent(ctx)}
	opData, _ := json.Marshal(op)
	rec := mesh.Record{JobID: j.ID, Tenant: j.Tenant, Status: job.StatusQueued, SubmittedAt: j.SubmittedAt, OpKey: opKey}
	data, _ := json.Marshal(rec)
	jobMade, first := s.mesh.CreateRecords(ctx, j.Tenant, j.ID, data, opKey, opData)
	made.job, joined, err = s.recordJob(ctx, j, opKey, jobMade, first)
	if err != nil || joined != nil {
		return opKey, made, joined, err
	}
	made.op, joined, err = s.recordOp(ctx, j, held, opKey, opData, first, made.job)
	return opKey, made, joined, err
}

// recordJob settles the job record's creation: created (its revision), or
// already there for this tenant's same job (0, and it goes on unless the
// job has ended). An operation record this call created for a job it does
// not take on goes again (only at the revision written here).
func (s *acceptor) recordJob(ctx context.Context, j *task.Task, opKey string, jobMade, first mesh.Created) (uint64, *Accepted, error) {
	if jobMade.Err == nil {
		return jobMade.Rev, nil, nil
	}
	dropOp := func() {
		if first.Err == nil {
			_ = withdraw(context.WithoutCancel(ctx), s.mesh.Idempotency, opKey, first.Rev)
		}
	}
	if !errors.Is(jobMade.Err, jetstream.ErrKeyExists) {
		dropOp()
		return 0, nil, &transientError{fmt.Errorf("record job: %w", jobMade.Err)}
	}
	old, _, lerr := s.mesh.LookupRecord(ctx, j.Tenant, j.ID)
	if lerr != nil {
		dropOp()
		return 0, nil, &transientError{lerr}
	}
	if old.Status.Terminal() {
		dropOp()
		return 0, &Accepted{JobID: j.ID, Tenant: j.Tenant, Joined: true}, nil
	}
	return 0, nil, nil
}

// recordOp settles the operation record's creation (first is the attempt
// made with the job record): created (its revision), or joined to the job
// that holds it. A job record this call created (at jobRev) is withdrawn
// when the job is not taken on, unless the caller holds the job.
func (s *acceptor) recordOp(ctx context.Context, j *task.Task, held bool, opKey string, opData []byte, first mesh.Created, jobRev uint64) (uint64, *Accepted, error) {
	for attempt := 1; ; attempt++ {
		rev, err := first.Rev, first.Err
		if attempt > 1 {
			rev, err = s.mesh.Idempotency.Create(ctx, opKey, opData)
		}
		if err == nil {
			return rev, nil, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			if !held {
				_ = withdraw(context.WithoutCancel(ctx), s.mesh.Results, keys.Record(j.Tenant, j.ID), jobRev)
			}
			return 0, nil, &transientError{fmt.Errorf("record operation: %w", err)}
		}
		joined, err := s.join(ctx, opKey, j)
		if errors.Is(err, job.ErrNotFound) && attempt < 3 {
			continue // the operation's job was refused and withdrawn meanwhile: this job takes it on
		}
		if err != nil {
			if !held && jobRev != 0 {
				_ = withdraw(context.WithoutCancel(ctx), s.mesh.Results, keys.Record(j.Tenant, j.ID), jobRev)
			}
			return 0, nil, err
		}
		if joined != "" {
			s.m.DupSuppressed.WithLabelValues(s.app().TaskLabel(j.Task)).Inc()
			return 0, &Accepted{JobID: joined, Tenant: j.Tenant, Joined: true}, nil
		}
		return 0, nil, nil
	}
}

// enqueue puts the recorded job on QUEUE. A job QUEUE refuses is held by
// its caller (held) or leaves nothing behind (settleRefusal).
func (s *acceptor) enqueue(ctx context.Context, j *task.Task, held bool, opKey string, made created, r room) (Accepted, error) {
	// Hints for the executor and the result service: the records are at
	// these revisions until one of them (or a joiner) changes them.
	j.Revs = nil
	if made.job != 0 || made.op != 0 {
		j.Revs = &task.Revs{Record: made.job, Op: made.op}
	}
	if err := s.mesh.Requeue(ctx, j, mesh.Accepted, ""); err != nil {
		var refusal error = &transientError{err}
		if mesh.IsStreamFull(err) {
			refusal = &BusyError{Code: job.CodeQueueFull, RetryAfter: r.retry, Ahead: r.ahead, Message: "Sluice's queue is full"}
		}
		if held {
			return Accepted{}, refusal
		}
		// Whatever refused it, a refused job leaves nothing behind: a
		// retry with the same Idempotency-Key must not join a job that
		// never runs.
		return s.settleRefusal(context.WithoutCancel(ctx), j, opKey, made, refusal)
	}
	s.queueShare.note(j.Tenant, envelopeSize(j))
	return Accepted{JobID: j.ID, Tenant: j.Tenant}, nil
}
