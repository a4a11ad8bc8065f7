package result

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/pkg/job"
)

// A job cancelled while queued ends with a result as complete as any
// other's: its submission and the deployment it was placed on (the
// operation record's) and the job's trace, and the cancel's answer names
// the model too.
func TestCancelledResultIsComplete(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id := job.NewID()
	sub := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec, _ := json.Marshal(&mesh.Record{JobID: id, Tenant: "acme", Status: job.StatusQueued, SubmittedAt: sub})
	if _, err := f.mesh.Results.Create(ctx, keys.Record("acme", id), rec); err != nil {
		t.Fatal(err)
	}
	opKey, key := mesh.OpKey("acme", "", id)
	op, _ := json.Marshal(&mesh.OpRecord{Key: key, JobID: id, Tenant: "acme", State: mesh.OpQueued, Provider: "p", Model: "m",
		Trace: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
	if _, err := f.mesh.Idempotency.Create(ctx, opKey, op); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	f.svc.Routes(mux, api.Auth{Tenants: []string{"acme"}, Open: true})
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodDelete, "/v1/jobs/"+id, nil))
	var got job.Summary
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != http.StatusOK || got.Model != "m" {
		t.Errorf("cancel: %d %s; want 200 naming model m", w.Code, w.Body)
	}
	r := awaitRecord(t, ctx, f.mesh, id).Result
	if r.Status != job.StatusCancelled || r.Provider != "p" || r.Model != "m" || !r.SubmittedAt.Equal(sub) || r.CompletedAt.IsZero() ||
		r.TraceID != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("cancelled result = %+v; want cancelled, p/m, submitted %v, completed, in the job's trace", r, sub)
	}
}
