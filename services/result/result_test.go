package result

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type fixture struct {
	svc  *Service
	mesh *mesh.Mesh
	ms   *metrics.Set
}

// setup runs the result service on an embedded server, with tenant acme.
func setup(t testing.TB, yaml string) *fixture {
	t.Helper()
	return setupLogged(t, "tenants: [{name: acme}]\n"+yaml, slog.New(slog.DiscardHandler))
}

// setupLogged runs the result service with the configuration yaml (whole),
// logging to log.
func setupLogged(t testing.TB, yaml string, log *slog.Logger) *fixture {
	t.Helper()
	m := meshtest.New(t, streams.Options{})
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	ms := metrics.New(prometheus.NewRegistry())
	svc, err := New(Config{App: cfg}, m, log, ms)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		// A test shorter than Run's start stops it while it binds its
		// consumer.
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	return &fixture{svc: svc, mesh: m, ms: ms}
}

// A result for a tenant the configuration does not have (a forged
// message) is counted under "unknown": tenant names in metric labels come
// only from the configuration.
func TestForgedTenantIsNoLabel(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tenant := range []string{"acme", "forged-tenant"} {
		if _, err := f.mesh.Finish(ctx, &task.Task{Job: job.Job{ID: job.NewID(), Tenant: tenant}}, mesh.Outcome{Status: job.StatusSucceeded}, mesh.Exit{}); err != nil {
			t.Fatal(err)
		}
	}
	// The two results are handled in either order: wait for both.
	natstest.Eventually(t, 10*time.Second, func() error {
		if count(f.ms.Results.WithLabelValues("unknown", "succeeded")) < 1 || count(f.ms.Results.WithLabelValues("acme", "succeeded")) < 1 {
			return errors.New("both results not counted yet")
		}
		return nil
	})
	if got := count(f.ms.Results.WithLabelValues("acme", "succeeded")); got != 1 {
		t.Errorf("results for acme: got %v, want 1", got)
	}
	if got := count(f.ms.Results.WithLabelValues("unknown", "succeeded")); got != 1 {
		t.Errorf("results for an unconfigured tenant under \"unknown\": got %v, want 1", got)
	}
}

// Long-polls beyond max_waiters_per_tenant get 429 at once; waits above
// max_wait are refused.
func TestLongPollLimits(t *testing.T) {
	t.Parallel()
	f := setup(t, "limits: {max_waiters_per_tenant: 1, max_wait: 1m}\n")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := job.NewID()
	if _, err := f.mesh.Results.Create(ctx, keys.Record("acme", id), []byte(`{"job_id":"`+id+`","tenant":"acme","status":"queued"}`)); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	f.svc.Routes(mux, api.Auth{Tenants: []string{"acme"}, Open: true})
	get := func(ctx context.Context, wait string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/jobs/"+id+"?wait="+wait, nil))
		return rec
	}
	release, ok := f.svc.cfg.Waiters.Acquire("acme") // another long-poll of acme's
	if !ok {
		t.Fatal("the first waiter slot: refused")
	}
	if rec := get(ctx, "5s"); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), api.CodeTooManyWaiters) {
		t.Errorf("a long-poll beyond the tenant's 1: got %d %s, want 429 too_many_waiters", rec.Code, rec.Body)
	}
	release()
	if rec := get(ctx, "100ms"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"queued"`) {
		t.Errorf("a long-poll after the slot freed: got %d %s, want 200 queued", rec.Code, rec.Body)
	}
	for _, wait := range []string{"2m", "1e300", "NaN", "-1s"} {
		if rec := get(ctx, wait); rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "wait") {
			t.Errorf("?wait=%s: got %d %s, want 400 naming wait", wait, rec.Code, rec.Body)
		}
	}
}

func count(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// The executor and ingest leave revisions (task.Revs, mesh.ResultHints) so
// the result service writes the job's record and settles its operation by
// compare-and-set without reading them. A hint that is stale (a joiner
// changed the operation since) or does not match (a forged record) is not
// used: the records are read and updated as without hints, and a joiner
// still gets its copy.
func TestResultHints(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	for _, tc := range []struct {
		name string
		// change runs after the in-flight write, before the result.
		change func(t *testing.T, ctx context.Context, opKey string, joiner string)
		// forge edits the hinted record.
		forge      func(op *mesh.OpRecord)
		staleRec   bool
		wantJoiner bool
	}{
		{name: "fresh"},
		{name: "stale record revision", staleRec: true},
		{name: "joined since", wantJoiner: true, change: func(t *testing.T, ctx context.Context, opKey, joiner string) {
			if _, err := f.mesh.UpdateOp(ctx, opKey, func(r *mesh.OpRecord) bool { r.Joiners = append(r.Joiners, joiner); return true }); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "forged key", forge: func(op *mesh.OpRecord) { op.Key = "another operation" }},
		{name: "forged job", forge: func(op *mesh.OpRecord) { op.JobID = job.NewID() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			id, joiner := job.NewID(), job.NewID()
			opKey, key := mesh.OpKey("acme", "", id)
			recRev, err := f.mesh.Results.Create(ctx, keys.Record("acme", id), []byte(`{"job_id":"`+id+`","tenant":"acme","status":"queued"}`))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.mesh.Results.Create(ctx, keys.Record("acme", joiner), []byte(`{"job_id":"`+joiner+`","tenant":"acme","status":"queued","submitted_at":"2026-01-02T03:04:05Z"}`)); err != nil {
				t.Fatal(err)
			}
			opData := []byte(`{"key":"` + key + `","job_id":"` + id + `","tenant":"acme","state":"queued"}`)
			opRev, err := f.mesh.Idempotency.Create(ctx, opKey, opData)
			if err != nil {
				t.Fatal(err)
			}
			inFlight := &mesh.OpRecord{Key: key, JobID: id, Tenant: "acme", State: mesh.OpInFlight, Provider: "p", Model: "m", Attempt: 1}
			if opRev, err = f.mesh.PutOpAt(ctx, opKey, inFlight, opRev); err != nil {
				t.Fatal(err)
			}
			if tc.change != nil {
				tc.change(t, ctx, opKey, joiner)
			}
			hinted := *inFlight
			if tc.forge != nil {
				tc.forge(&hinted)
			}
			if tc.staleRec {
				recRev += 1000
			}
			res := mesh.Outcome{Status: job.StatusSucceeded, Usage: &job.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}}
			if _, err := f.mesh.Finish(ctx, &task.Task{Job: job.Job{ID: id, Tenant: "acme"}}, res, mesh.Exit{OpKey: opKey, Hints: mesh.ResultHints{RecordRev: recRev, Op: &hinted, OpRev: opRev}}); err != nil {
				t.Fatal(err)
			}
			rec := awaitRecord(t, ctx, f.mesh, id)
			if rec.Status != job.StatusSucceeded || rec.Result.JobID != id || rec.Tenant != "acme" {
				t.Errorf("record = %+v, want succeeded for %s of acme", rec, id)
			}
			// The record is written before the operation is settled.
			var op *mesh.OpRecord
			natstest.Eventually(t, 10*time.Second, func() (err error) {
				if op, _, err = f.mesh.GetOp(ctx, opKey); err == nil && op.State == mesh.OpInFlight {
					err = errors.New("operation still in flight")
				}
				return err
			})
			if op.State != mesh.OpCompleted || op.Key != key || op.JobID != id || op.Usage == nil || op.Usage.TotalTokens != 7 {
				t.Errorf("operation = %+v, want completed with the job's key, id and usage", op)
			}
			if tc.wantJoiner {
				if jr := awaitRecord(t, ctx, f.mesh, joiner); jr.Result.DuplicateOf != id {
					t.Errorf("joiner's record = %+v, want a copy of %s", jr.Result, id)
				} else if got := jr.Result.SubmittedAt.Format(time.RFC3339); got != "2026-01-02T03:04:05Z" {
					t.Errorf("joiner's result submitted at %s, want its own submission, 2026-01-02T03:04:05Z", got)
				}
			}
		})
	}
}

// awaitRecord polls a job's record until it holds a result.
func awaitRecord(t *testing.T, ctx context.Context, m *mesh.Mesh, id string) *mesh.Record {
	t.Helper()
	var rec *mesh.Record
	natstest.Eventually(t, 10*time.Second, func() (err error) {
		if rec, _, err = m.Lookup(ctx, "acme", id); err == nil && rec.Result == nil {
			err = errors.New("no result recorded for " + id)
		}
		return err
	})
	return rec
}

// A result stored in RESULTS is the job's answer before the result service
// has recorded it: the caller that was handed the result (RESULTS stores
// it, then republishes it) reads the same from GET /v1/jobs/{id}, not
// "queued" or "running" (TestBatchLaneTakesBatchWork met that when the
// result service had 300 lane results ahead of the one it asked for).
func TestGetReadsAStoredResult(t *testing.T) {
	t.Parallel()
	m := meshtest.New(t, streams.Options{})
	cfg, err := config.Parse([]byte("tenants: [{name: acme}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{App: cfg}, m, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	// The service is not run: nothing records the result.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := job.NewID()
	if _, err := m.Results.Create(ctx, keys.Record("acme", id), []byte(`{"job_id":"`+id+`","tenant":"acme","status":"queued"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Finish(ctx, &task.Task{Job: job.Job{ID: id, Tenant: "acme"}}, mesh.Outcome{Status: job.StatusSucceeded}, mesh.Exit{}); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	svc.Routes(mux, api.Auth{Tenants: []string{"acme"}, Open: true})
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/jobs/"+id, nil))
	if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, `"status":"succeeded"`) || !strings.Contains(body, `"result"`) {
		t.Errorf("GET of a job whose result is stored but not yet recorded: %d %s; want 200, succeeded, with its result", rec.Code, body)
	}
	// The list says the same (it said "queued" until the result service
	// recorded the result: TestCancelQueuedAndList's list by status, rarely,
	// on a loaded machine).
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/jobs?status=succeeded", nil))
	if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, `"id":"`+id+`"`) {
		t.Errorf("GET /v1/jobs?status=succeeded with the job's result stored but not yet recorded: %d %s; want 200 listing %s", rec.Code, body, id)
	}
}
