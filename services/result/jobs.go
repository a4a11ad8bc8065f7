package result

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/pkg/clip"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Listing bounds: GET /v1/jobs answers at most MaxListLimit jobs a page.
const (
	DefaultListLimit = 20
	MaxListLimit     = 100
)

func notFound(w http.ResponseWriter) {
	api.Error(w, http.StatusNotFound, "invalid_request_error", "job_not_found", "no such job")
}

// GET /v1/jobs[?status=&limit=&after=]: the caller's own jobs, newest first
// (job ids are time-ordered), filtered by status, a page at a time; after
// is the last_id of the page before.
func (s *Service) list(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	tenant, err := auth.Tenant(r)
	if err != nil {
		api.AuthError(w, err)
		return
	}
	q := r.URL.Query()
	limit := DefaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxListLimit {
			api.ErrorParam(w, http.StatusBadRequest, "invalid_request_error", job.CodeInvalidRequest, "limit", "limit must be 1 to "+strconv.Itoa(MaxListLimit))
			return
		}
		limit = n
	}
	after := q.Get("after")
	if after != "" && !job.CanonicalID(after) {
		api.ErrorParam(w, http.StatusBadRequest, "invalid_request_error", job.CodeInvalidRequest, "after", "after must be a job id (a page's last_id)")
		return
	}
	status := job.Status(q.Get("status"))
	if status != "" && status != job.StatusQueued && status != job.StatusRunning && !status.Terminal() {
		api.ErrorParam(w, http.StatusBadRequest, "invalid_request_error", job.CodeInvalidRequest, "status", "unknown status "+strconv.Quote(clip.String(string(status), 40)))
		return
	}
	page, err := s.listJobs(r.Context(), tenant, status, after, limit)
	if err != nil {
		s.log.Warn("list jobs", "tenant", tenant, "err", err)
		api.Error(w, http.StatusServiceUnavailable, "sluice_error", "unavailable", "could not list the jobs")
		return
	}
	api.JSON(w, http.StatusOK, page)
}

// listJobs reads tenant's job records (keys <tenant>.<id> in the results
// bucket), newest first from after, keeping those of status.
func (s *Service) listJobs(ctx context.Context, tenant string, status job.Status, after string, limit int) (*job.List, error) {
	lister, err := s.mesh.Results.ListKeysFiltered(ctx, keys.Record(tenant, "*"))
	if err != nil {
		return nil, err
	}
	var ids []string
	for k := range lister.Keys() {
		if id := strings.TrimPrefix(k, tenant+"."); job.CanonicalID(id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	slices.Reverse(ids)
	page := &job.List{Object: "list", Data: []job.Summary{}}
	for _, id := range ids {
		if after != "" && id >= after {
			continue
		}
		rec, _, err := s.mesh.LookupRecord(ctx, tenant, id)
		if errors.Is(err, job.ErrNotFound) {
			continue // expired since the listing
		}
		if err != nil {
			return nil, err
		}
		s.withStored(ctx, rec)
		it := s.item(ctx, rec)
		if status != "" && it.Status != status {
			continue
		}
		if len(page.Data) == limit {
			page.HasMore = true
			break
		}
		page.Data = append(page.Data, it)
		page.LastID = id
	}
	return page, nil
}

// withStored gives a record without a result the result RESULTS stores
// for its job, if any: RESULTS stores a result before the caller is handed
// it and before this service records it, so a caller holding its result
// reads the same from GET /v1/jobs/{id} and from the list.
func (s *Service) withStored(ctx context.Context, rec *mesh.Record) {
	if rec.Result != nil {
		return
	}
	if res, err := s.mesh.StoredResult(ctx, rec.Tenant, rec.JobID); err == nil {
		rec.Result, rec.Status = res, res.Status
	}
}

// item is a record as listed: a queued job whose call has left is running.
func (s *Service) item(ctx context.Context, rec *mesh.Record) job.Summary {
	it := job.Summary{ID: rec.JobID, Object: "job", Status: rec.Status, SubmittedAt: rec.SubmittedAt}
	if res := rec.Result; res != nil {
		it.Status, it.Model, it.Error = res.Status, res.Model, res.Error
		return it
	}
	if op, _, err := s.mesh.GetOp(ctx, opKeyOf(rec)); err == nil && op.JobID == rec.JobID && op.Sent != nil && !op.Cancelled {
		it.Status = job.StatusRunning
	}
	return it
}

// opKeyOf is the idempotency bucket key of the record's job's operation.
func opKeyOf(rec *mesh.Record) string {
	if rec.OpKey != "" {
		return rec.OpKey
	}
	k, _ := mesh.OpKey(rec.Tenant, "", rec.JobID)
	return k
}
