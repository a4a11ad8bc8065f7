package result

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Cancelling a job (DELETE /v1/jobs/{id}, POST /v1/jobs/{id}/cancel) is
// decided on its operation record, by compare-and-set: the executor marks
// the record with its call's leaving (mesh.SentMark) by compare-and-set
// too, so exactly one of the two wins. A cancel that wins marks the record
// cancelled (an executor that takes the job later finds the mark and ends
// it without a call, giving its reservation's tokens back) and publishes
// the job's one terminal result, cancelled; admission, told on the cancel
// subject, drops the job if it holds it. A cancel that loses finds the
// call under way: the executor running it stops it when it can (a
// streamed call, whose upstream request it aborts) and says so; otherwise
// the answer is 409, the job running to its end.

// cancelOutcome is what the operation record said to a cancel.
type cancelOutcome int

const (
	cancelWon     cancelOutcome = iota // marked cancelled, or already
	cancelRunning                      // its call has left
	cancelDone                         // the operation is done (its result on the way)
	cancelJoined                       // it joined another job's operation, or others joined it
)

// CancelWait bounds how long a cancel waits for the job's terminal result.
const CancelWait = 5 * time.Second

func (s *Service) cancel(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	tenant, err := auth.Tenant(r)
	if err != nil {
		api.AuthError(w, err)
		return
	}
	id := r.PathValue("id")
	if !job.CanonicalID(id) {
		notFound(w)
		return
	}
	ctx := r.Context()
	rec, _, err := s.mesh.Lookup(ctx, tenant, id)
	if errors.Is(err, job.ErrNotFound) || (err == nil && rec.Tenant != tenant) {
		notFound(w)
		return
	}
	if err != nil {
		api.Error(w, http.StatusServiceUnavailable, "sluice_error", "unavailable", "could not read the job")
		return
	}
	if rec.Result != nil {
		finished(w, rec.Result.Status)
		return
	}
	out, op, err := s.markCancelled(ctx, rec)
	switch {
	case errors.Is(err, job.ErrNotFound):
		notFound(w) // its accept was refused and withdrew the record
		return
	case errors.Is(err, errNotRecorded):
		api.Error(w, http.StatusServiceUnavailable, "sluice_error", "unavailable", "the job is still being accepted; try again")
		return
	case err != nil:
		api.Error(w, http.StatusServiceUnavailable, "sluice_error", "unavailable", "could not cancel the job")
		return
	}
	switch out {
	case cancelJoined:
		api.Error(w, http.StatusConflict, "invalid_request_error", "job_shared",
			"the job shares its operation with another submission (same idempotency key) and cannot be cancelled alone")
		return
	case cancelRunning:
		if !s.stopRunning(tenant, id) {
			api.Error(w, http.StatusConflict, "invalid_request_error", "job_running",
				"the job's provider call is under way and cannot be stopped; it runs to its end")
			return
		}
	case cancelWon:
		if err := publishCancelled(ctx, s.mesh, rec, op); err != nil {
			api.Error(w, http.StatusServiceUnavailable, "sluice_error", "unavailable", "could not record the cancellation; the job is marked cancelled and will not be sent")
			return
		}
	}
	wctx, stop := context.WithTimeout(ctx, CancelWait)
	defer stop()
	res, err := s.mesh.Wait(wctx, tenant, id)
	if err != nil {
		api.JSON(w, http.StatusAccepted, map[string]any{"id": id, "object": "job", "status": job.StatusRunning, "cancel_requested": true})
		return
	}
	if res.Status != job.StatusCancelled {
		finished(w, res.Status) // it ended otherwise first
		return
	}
	api.JSON(w, http.StatusOK, job.Summary{ID: id, Object: "job", Status: res.Status, SubmittedAt: rec.SubmittedAt, Model: res.Model, Error: res.Error})
}

func finished(w http.ResponseWriter, st job.Status) {
	api.Error(w, http.StatusConflict, "invalid_request_error", "job_finished", "the job has already finished: "+string(st))
}

// CancelQueued cancels rec's job unless its provider call has left or it
// is done, as the cancel endpoint does (callers' batches, services/batches,
// cancel their jobs with it). It reports whether the job ends cancelled; a
// job whose call has left, or that shares its operation, runs to its end.
// An error (the job's operation not recorded yet, say) decides nothing:
// try again.
func CancelQueued(ctx context.Context, m *mesh.Mesh, rec *mesh.Record) (bool, error) {
	out, op, err := (&Service{mesh: m}).markCancelled(ctx, rec)
	if err != nil || out != cancelWon {
		return false, err
	}
	return true, publishCancelled(ctx, m, rec, op)
}

// publishCancelled ends rec's job, which markCancelled marked cancelled
// (op: its operation record as found, nil: none), through the mesh's one
// finish, and tells admission.
func publishCancelled(ctx context.Context, m *mesh.Mesh, rec *mesh.Record, op *mesh.OpRecord) error {
	res := mesh.Outcome{Status: job.StatusCancelled, Error: &job.Error{Code: job.CodeCancelled, Message: "cancelled by the caller before the provider was called"}}
	if op != nil && op.JobID == rec.JobID {
		res.TraceID = tracing.TraceIDOf(op.Trace) // the job's, not this request's
	}
	if _, err := m.Finish(ctx, cancelledJob(rec, op), res, mesh.Exit{OpKey: opKeyOf(rec)}); err != nil {
		return err
	}
	// Admission drops the job if it holds it (a best effort: the mark on
	// the record is what keeps it from the provider).
	_ = m.JS.Conn().Publish(mesh.CancelledSubject(rec.Tenant, rec.JobID), nil)
	return nil
}

// errNotRecorded: the job's record is there but not yet its operation
// record, which its accept writes with it (a cancel cannot mark what is
// not written yet, and must not answer that the job is done).
var errNotRecorded = errors.New("the job's operation is not recorded yet")

// markCancelled marks the job's operation cancelled unless its call has
// left or it is done; it returns the record as it found it (nil: none).
// Accept writes the job's record and its operation record at once, to two
// streams, so a cancel can find the first without the second: it waits
// for the operation record (up to CancelWait) rather than take the job
// for done. errNotRecorded when it does not come and the job has not
// ended; job.ErrNotFound when the job's record went meanwhile.
func (s *Service) markCancelled(ctx context.Context, rec *mesh.Record) (cancelOutcome, *mesh.OpRecord, error) {
	out, seen, err := s.markOp(ctx, rec)
	if !errors.Is(err, job.ErrNotFound) {
		return out, seen, err
	}
	wctx, stop := context.WithTimeout(ctx, CancelWait)
	recorded := s.mesh.AwaitOp(wctx, opKeyOf(rec))
	stop()
	if recorded {
		if out, seen, err = s.markOp(ctx, rec); !errors.Is(err, job.ErrNotFound) {
			return out, seen, err
		}
	}
	now, _, err := s.mesh.Lookup(ctx, rec.Tenant, rec.JobID)
	switch {
	case err != nil:
		return 0, nil, err
	case now.Result != nil:
		return cancelDone, nil, nil // ended, and its operation record expired
	}
	return 0, nil, errNotRecorded
}

// markOp is markCancelled on the operation record as it is now;
// job.ErrNotFound when there is none.
func (s *Service) markOp(ctx context.Context, rec *mesh.Record) (cancelOutcome, *mesh.OpRecord, error) {
	out := cancelWon
	var seen *mesh.OpRecord
	_, err := s.mesh.UpdateOp(ctx, opKeyOf(rec), func(o *mesh.OpRecord) bool {
		seen = o
		switch {
		case o.JobID != rec.JobID || len(o.Joiners) > 0:
			out = cancelJoined
		case o.State == mesh.OpCompleted || o.State == mesh.OpFailed:
			out = cancelDone
		case o.Cancelled:
			out = cancelWon
		case o.Sent != nil:
			out = cancelRunning
		default:
			o.Cancelled, out = true, cancelWon
			return true
		}
		return false
	})
	if err != nil {
		return 0, nil, err
	}
	return out, seen, nil
}

// cancelledJob is the job a cancel ends, as its record and its operation
// record (op, nil: none) know it: submitted when, placed on which
// deployment.
func cancelledJob(rec *mesh.Record, op *mesh.OpRecord) *task.Task {
	t := &task.Task{Job: job.Job{ID: rec.JobID, Tenant: rec.Tenant}, SubmittedAt: rec.SubmittedAt}
	if op != nil && op.JobID == rec.JobID {
		t.Provider, t.Model = op.Provider, op.Model
	}
	return t
}

// stopRunning asks the executor running the job to stop its call; true
// when one says it did.
func (s *Service) stopRunning(tenant, id string) bool {
	_, err := s.mesh.JS.Conn().Request(job.CancelSubject(tenant, id), nil, 500*time.Millisecond)
	return err == nil
}
