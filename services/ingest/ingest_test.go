package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type fixture struct {
	svc  *Service
	mesh *mesh.Mesh
	js   jetstream.JetStream
	nc   *nats.Conn
}

// setup runs ingest's dependencies on an embedded server, with QUEUE
// bounded at 2 jobs per tenant and priority and no admission draining it.
func setup(t testing.TB) *fixture {
	t.Helper()
	m := meshtest.New(t, streams.Options{Queue: streams.Bounds{MaxMsgsPerSubject: 2}})
	cfg, err := config.Parse([]byte(`
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: fast, rpm: 100000, tpm: 100000000}, {name: slow, rpm: 2, tpm: 1000000},
      {name: painter, rpm: 100000, tpm: 100000000, units: {images: 50, tasks: 0}}]
tenants: [{name: acme}, {name: beta}]
`))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{App: cfg}, m, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{svc: svc, mesh: m, js: m.JS, nc: m.JS.Conn()}
}

func newJob(tenant, idemKey string) *task.Task {
	return &task.Task{
		Job: job.Job{ID: job.NewID(), Tenant: tenant, IdempotencyKey: idemKey, Request: json.RawMessage(`{"model":"fast","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)},
	}
}

// answering waits until ingest, running, answers a wait hint on nc (Run
// subscribes in its own time), and returns its answer to data.
func answering(t testing.TB, nc *nats.Conn, tenant string, data []byte) *nats.Msg {
	t.Helper()
	var m *nats.Msg
	natstest.Eventually(t, 10*time.Second, func() (err error) {
		m, err = nc.Request(job.WaitSubject(tenant), data, 2*time.Second)
		if err != nil && !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("wait hint: %v", err)
		}
		return err
	})
	return m
}

// records reports whether the job's record and its operation record exist.
func (f *fixture) records(t *testing.T, j *task.Task) (jobRec, opRec bool) {
	t.Helper()
	ctx := context.Background()
	_, _, err := f.mesh.Lookup(ctx, j.Tenant, j.ID)
	if err != nil && !errors.Is(err, job.ErrNotFound) {
		t.Fatal(err)
	}
	opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	_, _, oerr := f.mesh.GetOp(ctx, opKey)
	if oerr != nil && !errors.Is(oerr, job.ErrNotFound) {
		t.Fatal(oerr)
	}
	return err == nil, oerr == nil
}

// A job QUEUE refuses leaves neither a job record nor an operation record,
// so it does not show as queued forever, and a later job with the same
// idempotency key is a new operation, not a join of the refused one.
func TestRefusedJobLeavesNoRecords(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	for i := range 2 {
		if _, err := f.svc.Accept(ctx, newJob("acme", "")); err != nil {
			t.Fatalf("job %d into an empty queue: %v", i+1, err)
		}
	}
	refused := newJob("acme", "order-3")
	_, err := f.svc.Accept(ctx, refused)
	var be *BusyError
	if !errors.Is(err, ErrQueueFull) || !errors.As(err, &be) || be.Code != job.CodeQueueFull || be.RetryAfter < time.Second {
		t.Fatalf("third job into a queue of 2 per tenant: got %v, want a queue_full BusyError with a RetryAfter of at least 1s", err)
	}
	refusedOp, _ := mesh.OpKey(refused.Tenant, refused.IdempotencyKey, refused.ID)
	if jobRec, opRec := f.records(t, refused); jobRec || opRec {
		t.Errorf("refused job: job record %v, operation record %v; want neither", jobRec, opRec)
	}

	// Over HTTP the same refusal is a 429 with Retry-After.
	mux := http.NewServeMux()
	f.svc.Routes(mux, api.Auth{Tenants: []string{"acme", "beta"}, Open: true})
	body := `{"idempotency_key":"order-4","request":{"model":"fast","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}}`
	req := httptest.NewRequest(http.MethodPost, "/v1/jobs", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sluice-Tenant", "acme")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), job.CodeQueueFull) {
		t.Errorf("POST /v1/jobs into a full queue: %d Retry-After %q %s; want 429 queue_full with Retry-After", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	opKeys, err := f.mesh.Idempotency.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range opKeys.Keys() {
		n++
	}
	if n != 2 {
		t.Errorf("operation records after 2 accepted and 2 refused jobs: %d, want 2", n)
	}
	// What is left of the refused job is a purge marker that expires: a
	// marker kept for the bucket's TTL would grow the store with each
	// refusal.
	for _, kv := range []struct {
		bucket, key string
	}{{streams.BucketResults, keys.Record(refused.Tenant, refused.ID)}, {streams.BucketIdempotency, refusedOp}} {
		st, err := f.js.Stream(ctx, "KV_"+kv.bucket)
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.GetLastMsgForSubject(ctx, "$KV."+kv.bucket+"."+kv.key)
		if err != nil {
			t.Fatalf("%s %s: %v", kv.bucket, kv.key, err)
		}
		if op, ttl := m.Header.Get("KV-Operation"), m.Header.Get("Nats-TTL"); op != "PURGE" || ttl == "" {
			t.Errorf("%s: the refused job's key holds operation %q with TTL %q, want a PURGE marker with a TTL", kv.bucket, op, ttl)
		}
	}

	// Another tenant's queue is not full.
	if _, err := f.svc.Accept(ctx, newJob("beta", "order-3")); err != nil {
		t.Errorf("beta's job: %v", err)
	}

	// Room again: a new job with the refused one's idempotency key is its
	// own operation.
	st, err := f.js.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(job.QueueSubject(job.Standard, "acme"))); err != nil {
		t.Fatal(err)
	}
	again := newJob("acme", "order-3")
	acc, err := f.svc.Accept(ctx, again)
	if err != nil || acc.Joined || acc.JobID != again.ID {
		t.Errorf("resubmission after the refusal: got %+v, %v; want its own job %s, not joined", acc, err, again.ID)
	}
}

// If another submission joined the operation between its creation and the
// refusal, the records are not deleted (the joiner waits for this job's
// result): the job is taken after all, through INTAKE.
func TestRefusedJobWithAJoinerGoesToIntake(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	for _, joiner := range []bool{false, true} {
		j := newJob("acme", "")
		j.Provider, j.Model = "p", "fast"
		var made created
		rec, _ := json.Marshal(mesh.Record{JobID: j.ID, Tenant: j.Tenant, Status: job.StatusQueued})
		rev, err := f.mesh.Results.Create(ctx, keys.Record(j.Tenant, j.ID), rec)
		if err != nil {
			t.Fatal(err)
		}
		made.job = rev
		opKey, key := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
		op, _ := json.Marshal(mesh.OpRecord{Key: key, JobID: j.ID, Tenant: j.Tenant, State: mesh.OpQueued})
		if made.op, err = f.mesh.Idempotency.Create(ctx, opKey, op); err != nil {
			t.Fatal(err)
		}
		if joiner {
			if _, err := f.mesh.UpdateOp(ctx, opKey, func(r *mesh.OpRecord) bool {
				r.Joiners = append(r.Joiners, job.NewID())
				return true
			}); err != nil {
				t.Fatal(err)
			}
		}
		busy := &BusyError{Code: job.CodeQueueFull, RetryAfter: time.Second}
		acc, err := f.svc.acceptor.settleRefusal(ctx, j, opKey, made, busy)
		jobRec, opRec := f.records(t, j)
		if !joiner {
			if err != busy || jobRec || opRec {
				t.Errorf("no joiner: got %+v, %v, records %v/%v; want the refusal and no records", acc, err, jobRec, opRec)
			}
			continue
		}
		if err != nil || acc.JobID != j.ID || !jobRec || !opRec {
			t.Errorf("with a joiner: got %+v, %v, records %v/%v; want the job accepted with its records", acc, err, jobRec, opRec)
		}
		st, err := f.js.Stream(ctx, streams.Intake)
		if err != nil {
			t.Fatal(err)
		}
		msg, err := st.GetLastMsgForSubject(ctx, job.IntakeSubject("acme"))
		if err != nil {
			t.Fatalf("with a joiner: nothing in INTAKE: %v", err)
		}
		var got task.Task
		if err := json.Unmarshal(msg.Data, &got); err != nil || got.ID != j.ID {
			t.Errorf("INTAKE holds %s, want job %s", msg.Data, j.ID)
		}
	}
}

// A job over NATS that QUEUE cannot take yet stays in INTAKE, accepted,
// with its records, and moves to QUEUE once there is room.
func TestIntakeJobWaitsForRoom(t *testing.T) {
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
	for range 2 {
		if _, err := f.svc.Accept(tctx, newJob("acme", "")); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := client.New(f.nc)
	if err != nil {
		t.Fatal(err)
	}
	j := newJob("acme", "")
	if _, err := cl.Submit(tctx, &j.Job); err != nil {
		t.Fatal(err)
	}
	// It is deferred, not refused: its records say queued.
	natstest.Eventually(t, 10*time.Second, func() error {
		rec, _, err := f.mesh.Lookup(tctx, j.Tenant, j.ID)
		if err == nil && rec.Status != job.StatusQueued {
			err = fmt.Errorf("the intake job's record says %s, want queued", rec.Status)
		}
		return err
	})
	queue, _ := f.js.Stream(tctx, streams.Queue)
	intake, _ := f.js.Stream(tctx, streams.Intake)
	if info, _ := intake.Info(tctx); info.State.Msgs != 1 {
		t.Errorf("INTAKE holds %d jobs, want the deferred one", info.State.Msgs)
	}
	// Room again: the job moves on.
	if err := queue.Purge(tctx); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		_, err := queue.GetLastMsgForSubject(tctx, job.QueueSubject(job.Standard, "acme"))
		return err // the deferred job not in QUEUE yet
	})
	if jobRec, opRec := f.records(t, j); !jobRec || !opRec {
		t.Errorf("enqueued intake job: records %v/%v, want both", jobRec, opRec)
	}
}

// Ingest answers sluice.ingest.wait.<tenant> with the wait it suggests: the
// jobs ahead in INTAKE and QUEUE at the model's rate.
func TestWaitHint(t *testing.T) {
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
	// 4 jobs ahead (2 per tenant) at 2 requests per minute: 150 s for a fifth.
	for _, tenant := range []string{"acme", "acme", "beta", "beta"} {
		if _, err := f.svc.Accept(ctx, newJob(tenant, "")); err != nil {
			t.Fatal(err)
		}
	}
	f.svc.queue.qmu.Lock()
	f.svc.queue.qAt = time.Time{} // read the queues now
	f.svc.queue.qmu.Unlock()
	slow := newJob("acme", "")
	slow.Request = json.RawMessage(`{"model":"slow","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)
	data, _ := json.Marshal(slow)
	m := answering(t, f.nc, "acme", data)
	var h job.WaitHint
	if err := json.Unmarshal(m.Data, &h); err != nil {
		t.Fatalf("answer %s: %v", m.Data, err)
	}
	if got, want := time.Duration(h.RetryAfterMS)*time.Millisecond, 150*time.Second; got != want {
		t.Errorf("suggested wait with 4 jobs ahead at 2 RPM: got %s, want %s", got, want)
	}
	// A job Sluice cannot read still gets an answer: at least a second.
	m, err := f.nc.Request(job.WaitSubject("acme"), []byte("not json"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(m.Data, &h); err != nil || h.RetryAfterMS < 1000 {
		t.Errorf("answer for an unreadable job: %s (%v), want at least 1000 ms", m.Data, err)
	}
}

// TestJobRefusedForAnyReasonLeavesNoRecords: whatever makes QUEUE refuse a
// job (here its size: the 1,048,500-byte job got 503 yet left its
// records), the refusal withdraws the records that call made, so a retry
// with the same Idempotency-Key is a new job, not a join of one that never
// runs.
func TestJobRefusedForAnyReasonLeavesNoRecords(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	st, err := f.js.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	small := st.CachedInfo().Config
	small.MaxMsgSize = 256 // every job is larger
	if _, err := f.js.UpdateStream(ctx, small); err != nil {
		t.Fatal(err)
	}
	refused := newJob("acme", "order-9")
	if _, err := f.svc.Accept(ctx, refused); err == nil || errors.Is(err, ErrQueueFull) {
		t.Fatalf("job larger than QUEUE's message size: got %v, want a transient refusal", err)
	}
	if jobRec, opRec := f.records(t, refused); jobRec || opRec {
		t.Errorf("refused job: job record %v, operation record %v; want neither", jobRec, opRec)
	}
	small.MaxMsgSize = 1 << 20
	if _, err := f.js.UpdateStream(ctx, small); err != nil {
		t.Fatal(err)
	}
	retry := newJob("acme", "order-9")
	acc, err := f.svc.Accept(ctx, retry)
	if err != nil || acc.Joined || acc.JobID != retry.ID {
		t.Fatalf("retry with the same Idempotency-Key: %+v, %v; want a new job %s", acc, err, retry.ID)
	}
}

// TestAcceptResolvesCost: a job for a model with units gets every unit
// the model limits in its sealed estimate (the amount stated, or 1), and
// a cost naming a unit the model does not limit is refused naming it.
func TestAcceptResolvesCost(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	painter := func(cost map[string]int) *task.Task {
		return &task.Task{
			Job: job.Job{ID: job.NewID(), Tenant: "beta", Cost: cost, Request: json.RawMessage(`{"model":"painter","max_tokens":16,"messages":[{"role":"user","content":"a cat"}]}`)},
		}
	}
	for _, tc := range []struct {
		name string
		j    *task.Task
		want map[string]int
	}{
		{"stated", painter(map[string]int{"images": 2}), map[string]int{"images": 2, "tasks": 1}},
		{"defaulted", painter(nil), map[string]int{"images": 1, "tasks": 1}},
	} {
		if _, err := f.svc.Accept(ctx, tc.j); err != nil {
			t.Fatalf("%s: Accept: %v", tc.name, err)
		}
		if got := tc.j.Estimate.Units; len(got) != len(tc.want) || got["images"] != tc.want["images"] || got["tasks"] != tc.want["tasks"] {
			t.Errorf("%s: estimated units %v, want %v", tc.name, got, tc.want)
		}
		if !f.svc.cfg.Guard.Sealed(tc.j) {
			t.Errorf("%s: the estimate is not sealed", tc.name)
		}
	}
	for _, tc := range []struct {
		name        string
		j           *task.Task
		code, field string
		inMsg       string
	}{
		{"a unit the model does not limit", painter(map[string]int{"audio_seconds": 3}), job.CodeInvalidRequest, "cost.audio_seconds", `does not limit unit "audio_seconds" (it limits images, tasks)`},
		{"a unit on a model without units", newJobWithCost(map[string]int{"images": 1}), job.CodeInvalidRequest, "cost.images", `model "fast" does not limit unit "images"`},
		{"above the unit's minute", painter(map[string]int{"images": 51}), job.CodeTooLarge, "cost.images", "allows 50 images per minute"},
	} {
		_, err := f.svc.Accept(ctx, tc.j)
		var ve *job.ValidationError
		if !errors.As(err, &ve) || ve.Code != tc.code || ve.Field != tc.field || !strings.Contains(ve.Message, tc.inMsg) {
			t.Errorf("%s: got %v, want a %s error on %s containing %q", tc.name, err, tc.code, tc.field, tc.inMsg)
		}
	}

	// Over HTTP: X-Sluice-Cost states the cost of a chat completion.
	mux := http.NewServeMux()
	f.svc.Routes(mux, api.Auth{Tenants: []string{"acme", "beta"}, Open: true})
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"painter","messages":[{"role":"user","content":"a cat"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sluice-Tenant", "beta")
	req.Header.Set(CostHeader, "images=2, videos=1")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), `does not limit unit \"videos\"`) {
		t.Errorf("X-Sluice-Cost naming an unknown unit: %d %s; want 400 naming the unit", rec.Code, rec.Body)
	}
}

func newJobWithCost(cost map[string]int) *task.Task {
	j := newJob("beta", "")
	j.Cost = cost
	return j
}

func TestParseCost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want map[string]int // nil: an error
	}{
		{"images=2", map[string]int{"images": 2}},
		{" images = 2 , audio_seconds=30,", map[string]int{"images": 2, "audio_seconds": 30}},
		{"images=0", map[string]int{"images": 0}},
		{"images", nil},
		{"images=two", nil},
		{"images=-1", nil},
		{"images=1,images=2", nil},
		{"Images=1", nil},
		{"=1", nil},
		{"", nil},
		{"a=1,b=1,c=1,d=1,e=1", nil},
	} {
		got, err := ParseCost(tc.in)
		if tc.want == nil {
			var ve *job.ValidationError
			if !errors.As(err, &ve) || ve.Code != job.CodeInvalidRequest {
				t.Errorf("ParseCost(%q) = %v, %v; want an invalid_request", tc.in, got, err)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("ParseCost(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("ParseCost(%q) = %v; want %v", tc.in, got, tc.want)
			}
		}
	}
}
