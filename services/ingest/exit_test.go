package ingest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// A refused INTAKE job's result says when it was submitted: the record an
// earlier delivery made says so when there is one (the refusal is then
// stored), and a refusal of a job of a tenant Sluice does not know (only
// announced) was submitted when it is refused.
func TestRefusalSubmittedAt(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.svc.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	tctx, tcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer tcancel()

	unknown := job.NewID()
	sub, err := f.nc.SubscribeSync(job.ResultSubject("nobody", unknown))
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().Add(-time.Second)
	if _, err := f.js.Publish(tctx, job.IntakeSubject("nobody"), []byte(`{"id":"`+unknown+`","tenant":"nobody","request":{"model":"fast","messages":[{"role":"user","content":"hi"}]}}`)); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r job.Result
	if err := json.Unmarshal(msg.Data, &r); err != nil || r.Error == nil || r.Error.Code != job.CodeUnknownTenant || r.SubmittedAt.Before(before) {
		t.Errorf("unknown tenant's refusal: %s (%v); want unknown_tenant, submitted now", msg.Data, err)
	}

	// An earlier delivery made the record; this one does not validate.
	id := job.NewID()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec, _ := json.Marshal(&mesh.Record{JobID: id, Tenant: "acme", Status: job.StatusQueued, SubmittedAt: at})
	if _, err := f.mesh.Results.Create(tctx, keys.Record("acme", id), rec); err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(tctx, job.IntakeSubject("acme"), []byte(`{"id":"`+id+`","tenant":"beta","request":{"model":"fast","messages":[{"role":"user","content":"hi"}]}}`)); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		st, err := f.js.Stream(tctx, streams.Results)
		if err != nil {
			return err
		}
		m, err := st.GetLastMsgForSubject(tctx, job.StoreSubject("acme", id))
		if err != nil {
			return err
		}
		return json.Unmarshal(m.Data, &r)
	})
	if r.Status != job.StatusFailed || !r.SubmittedAt.Equal(at) || r.CompletedAt.IsZero() {
		t.Errorf("stored refusal: %+v; want failed, submitted %v (its record's), completed", r, at)
	}
}
