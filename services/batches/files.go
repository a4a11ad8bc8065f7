package batches

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Purposes of files.
const (
	PurposeBatch       = "batch"        // a batch's input, uploaded
	PurposeBatchOutput = "batch_output" // a batch's output or error file
)

// fileRecord is a file as stored under file.<tenant>.<id>; its content is
// the object <tenant>/<id>.
type fileRecord struct {
	ID        string `json:"id"`
	Tenant    string `json:"tenant"`
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
}

// object is the file as OpenAI answers it.
func (f *fileRecord) object() map[string]any {
	return map[string]any{"id": f.ID, "object": "file", "bytes": f.Bytes, "created_at": f.CreatedAt, "filename": f.Filename,
		"purpose": f.Purpose, "status": "processed", "status_details": nil, "expires_at": nil}
}

// files owns the tenants' files: their records and contents.
type files struct{ *deps }

// errTooLarge is a file over batches.max_file_bytes.
var errTooLarge = errors.New("file too large")

// get reads tenant's file id; job.ErrNotFound for none (or another
// tenant's: the key names the tenant).
func (f *files) get(ctx context.Context, tenant, id string) (*fileRecord, error) {
	kv, _, err := f.stores(ctx)
	if err != nil {
		return nil, err
	}
	if !fileIDRE.MatchString(id) {
		return nil, job.ErrNotFound
	}
	e, err := kv.Get(ctx, fileKey(tenant, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, job.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	var rec fileRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Tenant != tenant || rec.ID != id {
		return nil, fmt.Errorf("file record %s: unreadable", id)
	}
	return &rec, nil
}

// count is how many keys under prefix (a tenant's files, its open
// batches) the bucket holds.
func (d *deps) count(ctx context.Context, prefix string) (int, error) {
	kv, _, err := d.stores(ctx)
	if err != nil {
		return 0, err
	}
	ids, err := keysUnder(ctx, kv, prefix)
	return len(ids), err
}

// keysUnder lists the last tokens of the keys under prefix ("a.b."); none
// is not an error.
func keysUnder(ctx context.Context, kv jetstream.KeyValue, prefix string) ([]string, error) {
	l, err := kv.ListKeysFiltered(ctx, prefix+"*")
	if err != nil {
		return nil, err
	}
	var out []string
	for k := range l.Keys() {
		out = append(out, strings.TrimPrefix(k, prefix))
	}
	return out, nil
}

// put stores rec's content from r (at most limit bytes: errTooLarge past
// it) and sets its Bytes; record then makes it a file.
func (f *files) put(ctx context.Context, rec *fileRecord, r io.Reader, limit int64) error {
	_, store, err := f.stores(ctx)
	if err != nil {
		return err
	}
	lr := &limitReader{r: r, left: limit}
	info, err := store.Put(ctx, jetstream.ObjectMeta{Name: objectName(rec.Tenant, rec.ID)}, lr)
	if lr.over {
		return errTooLarge
	}
	if err != nil {
		return fmt.Errorf("store file %s: %w", rec.ID, err)
	}
	rec.Bytes = int64(info.Size)
	return nil
}

// record writes rec, whose content put stored.
func (f *files) record(ctx context.Context, rec *fileRecord) error {
	kv, _, err := f.stores(ctx)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(rec)
	if _, err := kv.Put(ctx, fileKey(rec.Tenant, rec.ID), data); err != nil {
		return fmt.Errorf("record file %s: %w", rec.ID, err)
	}
	return nil
}

// ReadWithin bounds reading one file: the object store's reader ends at
// its context's deadline (without one, after its default timeout of a
// few seconds). A batch's submission that takes longer (QUEUE full for
// an hour) stops there and starts again from its last checkpoint.
const ReadWithin = time.Hour

// open reads tenant's file id's content; the caller closes it.
func (f *files) open(ctx context.Context, tenant, id string) (io.ReadCloser, error) {
	_, store, err := f.stores(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, ReadWithin)
	res, err := store.Get(ctx, objectName(tenant, id))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		cancel()
		return nil, job.ErrNotFound
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &reading{ObjectResult: res, cancel: cancel}, nil
}

// reading is an object being read, its context ended when it is closed.
type reading struct {
	jetstream.ObjectResult
	cancel context.CancelFunc
}

func (r *reading) Close() error {
	defer r.cancel()
	return r.ObjectResult.Close()
}

// remove deletes tenant's file id: its record, then its content.
func (f *files) remove(ctx context.Context, tenant, id string) error {
	kv, store, err := f.stores(ctx)
	if err != nil {
		return err
	}
	if err := kv.Delete(ctx, fileKey(tenant, id)); err != nil {
		return err
	}
	if err := store.Delete(ctx, objectName(tenant, id)); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return err
	}
	return nil
}

// limitReader reads at most left bytes of r; past them it fails.
type limitReader struct {
	r    io.Reader
	left int64
	over bool
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.left < 0 {
		l.over = true
		return 0, errTooLarge
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		l.over = true
		return 0, errTooLarge
	}
	return n, err
}

// cleanName is an uploaded file's name as stored: its base, at most 256
// bytes.
func cleanName(name string) string {
	if i := strings.LastIndexAny(name, `/\`); i >= 0 {
		name = name[i+1:]
	}
	if len(name) > 256 {
		name = name[:256]
	}
	return strings.ToValidUTF8(name, "")
}
