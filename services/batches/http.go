package batches

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// FileTransfer is how long an upload, a download or a batch's validation
// (which reads its whole input) may take, beyond the server's timeouts.
const FileTransfer = 10 * time.Minute

// handlers serve the files and batches endpoints: they read, check and
// record; the runner (woken by wake) does the rest.
type handlers struct {
	*deps
	files *files
	wake  func()
}

func badRequest(w http.ResponseWriter, code, param, msg string) {
	api.NoRetry(w)
	api.ErrorParam(w, http.StatusBadRequest, "invalid_request_error", code, param, msg)
}

// notFound answers an id the tenant has no such object of, whether or
// not another tenant has one.
func notFound(w http.ResponseWriter, what, id string) {
	api.ErrorParam(w, http.StatusNotFound, "invalid_request_error", "not_found", "id", fmt.Sprintf("No such %s object: %s", what, clip.String(id, 64)))
}

func (h *handlers) unavailable(w http.ResponseWriter, what string, err error) {
	h.log.Warn(what, "err", err)
	api.RetryAfter(w, time.Second)
	api.Error(w, http.StatusServiceUnavailable, "sluice_error", "unavailable", "could not "+what+" now; retry")
}

// POST /v1/files: multipart, purpose "batch" and the file's JSONL.
func (h *handlers) upload(w http.ResponseWriter, r *http.Request, tenant string) {
	ctx := r.Context()
	bounds := h.app().Batches
	api.ExtendDeadlines(w, FileTransfer) // a file may take longer than a request's timeouts
	r.Body = http.MaxBytesReader(w, r.Body, bounds.MaxFileBytes+1<<20)
	mr, err := r.MultipartReader()
	if err != nil {
		badRequest(w, job.CodeInvalidRequest, "file", "the body must be multipart/form-data with a file and its purpose")
		return
	}
	if n, err := h.count(ctx, fileKey(tenant, "")); err != nil {
		h.unavailable(w, "count the tenant's files", err)
		return
	} else if n >= bounds.MaxFilesPerTenant {
		badRequest(w, "file_limit_exceeded", "file", fmt.Sprintf("the tenant holds %d files, its bound (batches.max_files_per_tenant); delete some first", n))
		return
	}
	rec := &fileRecord{ID: newFileID(), Tenant: tenant, CreatedAt: h.now().Unix()}
	stored := false
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			h.dropContent(rec, stored)
			badRequest(w, job.CodeInvalidRequest, "file", "the multipart body could not be read")
			return
		}
		switch part.FormName() {
		case "purpose":
			p, _ := io.ReadAll(io.LimitReader(part, 64))
			rec.Purpose = strings.TrimSpace(string(p))
		case "file":
			if stored {
				h.dropContent(rec, stored)
				badRequest(w, job.CodeInvalidRequest, "file", "one file per upload")
				return
			}
			rec.Filename = cleanName(part.FileName())
			if err := h.files.put(ctx, rec, part, bounds.MaxFileBytes); errors.Is(err, errTooLarge) {
				api.NoRetry(w)
				api.ErrorParam(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "file_too_large", "file",
					fmt.Sprintf("the file is over the tenant's bound of %d bytes (batches.max_file_bytes)", bounds.MaxFileBytes))
				return
			} else if err != nil {
				h.unavailable(w, "store the file", err)
				return
			}
			stored = true
		default:
			_, _ = io.Copy(io.Discard, io.LimitReader(part, 1<<20))
		}
	}
	switch {
	case !stored:
		badRequest(w, job.CodeInvalidRequest, "file", "the upload has no file")
		return
	case rec.Purpose != PurposeBatch:
		h.dropContent(rec, stored)
		badRequest(w, job.CodeInvalidRequest, "purpose", fmt.Sprintf("Sluice takes files of purpose %q (the Batch API), not %q", PurposeBatch, clip.String(rec.Purpose, 64)))
		return
	}
	if err := h.files.record(ctx, rec); err != nil {
		h.dropContent(rec, stored)
		h.unavailable(w, "record the file", err)
		return
	}
	api.JSON(w, http.StatusOK, rec.object())
}

// dropContent deletes an upload's content that will not be recorded.
func (h *handlers) dropContent(rec *fileRecord, stored bool) {
	if !stored {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, store, err := h.stores(ctx); err == nil {
		_ = store.Delete(ctx, objectName(rec.Tenant, rec.ID))
	}
}

// GET /v1/files/{id}
func (h *handlers) getFile(w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	rec, err := h.files.get(r.Context(), tenant, id)
	switch {
	case errors.Is(err, job.ErrNotFound):
		notFound(w, "File", id)
	case err != nil:
		h.unavailable(w, "read the file", err)
	default:
		api.JSON(w, http.StatusOK, rec.object())
	}
}

// GET /v1/files/{id}/content
func (h *handlers) content(w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	rec, err := h.files.get(r.Context(), tenant, id)
	if errors.Is(err, job.ErrNotFound) {
		notFound(w, "File", id)
		return
	}
	if err != nil {
		h.unavailable(w, "read the file", err)
		return
	}
	body, err := h.files.open(r.Context(), tenant, id)
	if errors.Is(err, job.ErrNotFound) {
		notFound(w, "File", id)
		return
	}
	if err != nil {
		h.unavailable(w, "read the file", err)
		return
	}
	defer body.Close()
	api.ExtendDeadlines(w, FileTransfer)
	w.Header().Set("Content-Type", "application/jsonl")
	w.Header().Set("Content-Length", strconv.FormatInt(rec.Bytes, 10))
	_, _ = io.Copy(w, body)
}

// DELETE /v1/files/{id}
func (h *handlers) deleteFile(w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	if _, err := h.files.get(r.Context(), tenant, id); errors.Is(err, job.ErrNotFound) {
		notFound(w, "File", id)
		return
	} else if err != nil {
		h.unavailable(w, "read the file", err)
		return
	}
	if inUse, err := h.inputOfOpen(r.Context(), tenant, id); err != nil {
		h.unavailable(w, "read the tenant's batches", err)
		return
	} else if inUse != "" {
		api.NoRetry(w)
		api.Error(w, http.StatusConflict, "invalid_request_error", "file_in_use", "the file is the input of batch "+inUse+", not yet ended")
		return
	}
	if err := h.files.remove(r.Context(), tenant, id); err != nil {
		h.unavailable(w, "delete the file", err)
		return
	}
	api.JSON(w, http.StatusOK, map[string]any{"id": id, "object": "file", "deleted": true})
}

// inputOfOpen is the tenant's batch not yet ended whose input is file id
// ("": none): its runner reads the file until it ends.
func (h *handlers) inputOfOpen(ctx context.Context, tenant, id string) (string, error) {
	kv, _, err := h.stores(ctx)
	if err != nil {
		return "", err
	}
	open, err := keysUnder(ctx, kv, openKey(tenant, ""))
	if err != nil {
		return "", err
	}
	for _, bid := range open {
		b, _, err := getBatch(ctx, kv, tenant, bid)
		if err == nil && b.InputFileID == id && !b.ended() {
			return bid, nil
		}
	}
	return "", nil
}

// GET /v1/batches/{id}
func (h *handlers) getBatch(w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	b, err := h.batch(r, tenant, id)
	switch {
	case errors.Is(err, job.ErrNotFound):
		notFound(w, "Batch", id)
	case err != nil:
		h.unavailable(w, "read the batch", err)
	default:
		api.JSON(w, http.StatusOK, b.object())
	}
}

// batch reads tenant's batch id (job.ErrNotFound for none).
func (h *handlers) batch(r *http.Request, tenant, id string) (*batchRecord, error) {
	if !batchIDRE.MatchString(id) {
		return nil, job.ErrNotFound
	}
	kv, _, err := h.stores(r.Context())
	if err != nil {
		return nil, err
	}
	b, _, err := getBatch(r.Context(), kv, tenant, id)
	return b, err
}

// POST /v1/batches/{id}/cancel: the batch is cancelling until its jobs
// not yet sent are cancelled and the others have ended; it then ends
// cancelled, with the lines that completed in its output file.
func (h *handlers) cancel(w http.ResponseWriter, r *http.Request, tenant string) {
	id := r.PathValue("id")
	if _, err := h.batch(r, tenant, id); errors.Is(err, job.ErrNotFound) {
		notFound(w, "Batch", id)
		return
	} else if err != nil {
		h.unavailable(w, "read the batch", err)
		return
	}
	kv, _, _ := h.stores(r.Context())
	ended := false
	b, err := updateBatch(r.Context(), kv, tenant, id, func(b *batchRecord) bool {
		switch {
		case b.ended():
			ended = true
			return false
		case b.CancellingAt != 0 || b.Status == StatusFinalizing:
			return false
		}
		b.Status, b.CancellingAt = StatusCancelling, h.now().Unix()
		return true
	})
	if err != nil {
		h.unavailable(w, "cancel the batch", err)
		return
	}
	if ended {
		api.NoRetry(w)
		api.Error(w, http.StatusConflict, "invalid_request_error", "batch_ended", fmt.Sprintf("the batch has already ended: %s", b.Status))
		return
	}
	h.wake()
	api.JSON(w, http.StatusOK, b.object())
}

// Listing bounds of GET /v1/batches.
const (
	defaultListLimit = 20
	maxListLimit     = 100
)

// GET /v1/batches[?limit=&after=]: the tenant's batches, newest first.
func (h *handlers) list(w http.ResponseWriter, r *http.Request, tenant string) {
	ctx := r.Context()
	limit := defaultListLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			badRequest(w, job.CodeInvalidRequest, "limit", "limit must be 1 to "+strconv.Itoa(maxListLimit))
			return
		}
		limit = n
	}
	after := r.URL.Query().Get("after")
	kv, _, err := h.stores(ctx)
	var ids []string
	if err == nil {
		ids, err = keysUnder(ctx, kv, batchKey(tenant, ""))
	}
	if err != nil {
		h.unavailable(w, "list the batches", err)
		return
	}
	slices.Sort(ids)
	slices.Reverse(ids)
	data := []map[string]any{}
	more := false
	for _, id := range ids {
		if after != "" && id >= after {
			continue
		}
		if len(data) == limit {
			more = true
			break
		}
		if b, _, err := getBatch(ctx, kv, tenant, id); err == nil {
			data = append(data, b.object())
		}
	}
	page := map[string]any{"object": "list", "data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if len(data) > 0 {
		page["first_id"], page["last_id"] = data[0]["id"], data[len(data)-1]["id"]
	}
	api.JSON(w, http.StatusOK, page)
}
