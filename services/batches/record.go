package batches

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/pkg/job"
)

// A batch's statuses, as OpenAI names them.
const (
	StatusValidating = "validating"
	StatusFailed     = "failed"
	StatusInProgress = "in_progress"
	StatusFinalizing = "finalizing"
	StatusCompleted  = "completed"
	StatusExpired    = "expired"
	StatusCancelling = "cancelling"
	StatusCancelled  = "cancelled"
)

// MaxLines bounds a batch's requests, as OpenAI does.
const MaxLines = 50_000

// Window is the one completion window OpenAI offers.
const Window = 24 * time.Hour

// batchRecord is a batch as stored under batch.<tenant>.<id>.
type batchRecord struct {
	ID               string            `json:"id"`
	Tenant           string            `json:"tenant"`
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"` // OpenAI's: /v1/chat/completions
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	Status           string            `json:"status"`
	Errors           []lineError       `json:"errors,omitempty"`
	Total            int               `json:"total"`
	Submitted        int               `json:"submitted"` // lines accepted or refused, in file order
	Completed        int               `json:"completed"`
	Failed           int               `json:"failed"`
	OutputFileID     string            `json:"output_file_id,omitempty"`
	ErrorFileID      string            `json:"error_file_id,omitempty"`

	CreatedAt    int64 `json:"created_at"`
	ExpiresAt    int64 `json:"expires_at"`
	InProgressAt int64 `json:"in_progress_at,omitempty"`
	FinalizingAt int64 `json:"finalizing_at,omitempty"`
	CompletedAt  int64 `json:"completed_at,omitempty"`
	FailedAt     int64 `json:"failed_at,omitempty"`
	ExpiredAt    int64 `json:"expired_at,omitempty"`
	CancellingAt int64 `json:"cancelling_at,omitempty"`
	CancelledAt  int64 `json:"cancelled_at,omitempty"`

	// The runner holding the batch, until LeaseUntil (unix ms).
	Owner      string `json:"owner,omitempty"`
	LeaseUntil int64  `json:"lease_until,omitempty"`
}

// lineError is one validation error, as OpenAI reports it.
type lineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
	Line    int    `json:"line,omitempty"` // 1-based; 0: the whole file
}

// ended reports whether the batch reached an end state.
func (b *batchRecord) ended() bool {
	switch b.Status {
	case StatusFailed, StatusCompleted, StatusExpired, StatusCancelled:
		return true
	}
	return false
}

// object is the batch as OpenAI answers it.
func (b *batchRecord) object() map[string]any {
	ts := func(v int64) any {
		if v == 0 {
			return nil
		}
		return v
	}
	str := func(v string) any {
		if v == "" {
			return nil
		}
		return v
	}
	var errs any
	if len(b.Errors) > 0 {
		data := make([]map[string]any, len(b.Errors))
		for i, e := range b.Errors {
			data[i] = map[string]any{"code": e.Code, "message": e.Message, "param": str(e.Param), "line": nil}
			if e.Line > 0 {
				data[i]["line"] = e.Line
			}
		}
		errs = map[string]any{"object": "list", "data": data}
	}
	var meta any
	if len(b.Metadata) > 0 {
		meta = b.Metadata
	}
	return map[string]any{"id": b.ID, "object": "batch", "endpoint": b.Endpoint, "errors": errs, "input_file_id": b.InputFileID,
		"completion_window": b.CompletionWindow, "status": b.Status, "output_file_id": str(b.OutputFileID), "error_file_id": str(b.ErrorFileID),
		"created_at": b.CreatedAt, "in_progress_at": ts(b.InProgressAt), "expires_at": ts(b.ExpiresAt), "finalizing_at": ts(b.FinalizingAt),
		"completed_at": ts(b.CompletedAt), "failed_at": ts(b.FailedAt), "expired_at": ts(b.ExpiredAt), "cancelling_at": ts(b.CancellingAt),
		"cancelled_at": ts(b.CancelledAt), "metadata": meta,
		"request_counts": map[string]int{"total": b.Total, "completed": b.Completed, "failed": b.Failed}}
}

// Ids: batch_<32 hex>, file-<32 hex>, both time-ordered (a UUIDv7's
// bytes), so a tenant's keys list newest last.
var (
	batchIDRE = regexp.MustCompile(`^batch_[0-9a-f]{32}$`)
	fileIDRE  = regexp.MustCompile(`^file-[0-9a-f]{32}$`)
)

func newHex() string {
	u := uuid.Must(uuid.NewV7())
	return hex.EncodeToString(u[:])
}

func newBatchID() string { return "batch_" + newHex() }
func newFileID() string  { return "file-" + newHex() }

// derivedFileID is the id of a batch's output (kind "output") or error
// file: derived, so that writing it again replaces it.
func derivedFileID(batchID, kind string) string {
	sum := sha256.Sum256([]byte("sluice-batch-file\x00" + batchID + "\x00" + kind))
	return "file-" + hex.EncodeToString(sum[:16])
}

// lineJob is the job id and idempotency key of a batch's line: derived
// from the batch id and the line's custom_id, so that submitting a line
// again (a retry, a runner taking the batch over) is the same job. The id
// is a UUIDv7 of the batch's creation time, so job listings order it.
func lineJob(b *batchRecord, customID string) (id, idemKey string) {
	sum := sha256.Sum256([]byte(b.ID + "\x00" + customID))
	var u uuid.UUID
	ms := uint64(b.CreatedAt) * 1000
	for i := 0; i < 6; i++ {
		u[i] = byte(ms >> (8 * (5 - i)))
	}
	copy(u[6:], sum[:10])
	u[6] = 0x70 | u[6]&0x0f
	u[8] = 0x80 | u[8]&0x3f
	return u.String(), "batch:" + b.ID + ":" + hex.EncodeToString(sum[:16])
}

// Keys in the batches bucket. tenant is a configured tenant's name (a
// subject token); ids are checked by the patterns above first.
func batchKey(tenant, id string) string { return "batch." + tenant + "." + id }
func openKey(tenant, id string) string  { return "open." + tenant + "." + id }
func fileKey(tenant, id string) string  { return "file." + tenant + "." + id }
func refusedKey(tenant, id string, line int) string {
	return fmt.Sprintf("refused.%s.%s.%d", tenant, id, line)
}

// objectName is a file's content's name in the files object store.
func objectName(tenant, id string) string { return tenant + "/" + id }

// getBatch reads a batch record; job.ErrNotFound when there is none.
func getBatch(ctx context.Context, kv jetstream.KeyValue, tenant, id string) (*batchRecord, uint64, error) {
	e, err := kv.Get(ctx, batchKey(tenant, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, job.ErrNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	var b batchRecord
	if err := json.Unmarshal(e.Value(), &b); err != nil || b.Tenant != tenant || b.ID != id {
		return nil, 0, fmt.Errorf("batch record %s: unreadable", id)
	}
	return &b, e.Revision(), nil
}

// updateBatch applies fn to the batch record by compare-and-set, again on
// a conflict; fn returns false to write nothing. It returns the record as
// written (or as read, when fn declined).
func updateBatch(ctx context.Context, kv jetstream.KeyValue, tenant, id string, fn func(b *batchRecord) bool) (*batchRecord, error) {
	for attempt := 0; ; attempt++ {
		b, rev, err := getBatch(ctx, kv, tenant, id)
		if err != nil {
			return nil, err
		}
		if !fn(b) {
			return b, nil
		}
		data, _ := json.Marshal(b)
		_, err = kv.Update(ctx, batchKey(tenant, id), data, rev)
		if err == nil {
			return b, nil
		}
		if !(errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)) || attempt > 20 {
			return nil, fmt.Errorf("update batch %s: %w", id, err)
		}
	}
}
