package result

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
)

// queuedRecord writes the record accept writes first for a queued job of
// acme's, and returns the job's id and its operation record's key.
func queuedRecord(t *testing.T, ctx context.Context, m *mesh.Mesh) (id, opKey string, op []byte) {
	t.Helper()
	id = job.NewID()
	rec, _ := json.Marshal(&mesh.Record{JobID: id, Tenant: "acme", Status: job.StatusQueued, SubmittedAt: time.Now().UTC()})
	if _, err := m.Results.Create(ctx, keys.Record("acme", id), rec); err != nil {
		t.Fatal(err)
	}
	opKey, key := mesh.OpKey("acme", "", id)
	op, _ = json.Marshal(&mesh.OpRecord{Key: key, JobID: id, Tenant: "acme", State: mesh.OpQueued, Provider: "p", Model: "m"})
	return id, opKey, op
}

// cancelAsync sends DELETE /v1/jobs/{id} to f's service and delivers the
// answer.
func cancelAsync(ctx context.Context, f *fixture, id string) <-chan *httptest.ResponseRecorder {
	mux := http.NewServeMux()
	f.svc.Routes(mux, api.Auth{Tenants: []string{"acme"}, Open: true})
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodDelete, "/v1/jobs/"+id, nil))
		answered <- w
	}()
	return answered
}

// A cancel that comes between the two records accept writes at once (the
// job's and its operation's, to two streams) waits for the operation
// record and wins. It took the job for done instead: it marked nothing,
// answered 202 "cancel requested" after waiting for a result, and the job
// then ran (TestCancelQueuedAndList, rarely, on a loaded machine).
func TestCancelBeforeOpRecorded(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id, opKey, op := queuedRecord(t, ctx, f.mesh)
	idem, err := f.mesh.JS.Stream(ctx, "KV_"+f.mesh.Idempotency.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	answered := cancelAsync(ctx, f, id)
	// The cancel waits by watching the bucket (a consumer on its stream):
	// the operation record is written once it does.
	natstest.Eventually(t, 10*time.Second, func() error {
		select {
		case w := <-answered:
			t.Fatalf("cancel answered %d %s with no operation record written; want it to wait for the record", w.Code, w.Body)
		default:
		}
		info, err := idem.Info(ctx)
		if err == nil && info.State.Consumers == 0 {
			err = errors.New("nothing watches the idempotency bucket")
		}
		return err
	})
	if _, err := f.mesh.Idempotency.Create(ctx, opKey, op); err != nil {
		t.Fatal(err)
	}
	var w *httptest.ResponseRecorder
	select {
	case w = <-answered:
	case <-ctx.Done():
		t.Fatal("no answer to the cancel")
	}
	var got job.Summary
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != http.StatusOK || got.Status != job.StatusCancelled {
		t.Errorf("cancel: %d %s; want 200 cancelled", w.Code, w.Body)
	}
	if o, _, err := f.mesh.GetOp(ctx, opKey); err != nil || !o.Cancelled {
		t.Errorf("operation record %+v (%v); want marked cancelled", o, err)
	}
	if r := awaitRecord(t, ctx, f.mesh, id).Result; r.Status != job.StatusCancelled {
		t.Errorf("result %+v; want cancelled", r)
	}
}

// A job whose operation record does not come (its accept is stuck, or
// died between the two writes and its redelivery will write it) cannot be
// cancelled yet: 503, nothing written, rather than an answer that the
// cancel was taken.
func TestCancelWithoutOpRecord(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id, opKey, _ := queuedRecord(t, ctx, f.mesh)
	var w *httptest.ResponseRecorder
	select {
	case w = <-cancelAsync(ctx, f, id):
	case <-ctx.Done():
		t.Fatal("no answer to the cancel")
	}
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("cancel: %d %s; want 503", w.Code, w.Body)
	}
	if rec, _, err := f.mesh.Lookup(ctx, "acme", id); err != nil || rec.Result != nil {
		t.Errorf("record %+v (%v); want no result", rec, err)
	}
	if _, _, err := f.mesh.GetOp(ctx, opKey); !errors.Is(err, job.ErrNotFound) {
		t.Errorf("operation record: %v; want none written", err)
	}
}
