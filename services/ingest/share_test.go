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

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// setupBytes is setup with QUEUE and INTAKE bounded at 1 MiB in all and
// 256 KiB per tenant (below what the configuration allows, so the jobs
// that fill it are cheap to tokenize), and nothing draining them.
func setupBytes(t *testing.T) *fixture {
	t.Helper()
	m := meshtest.New(t, streams.Options{Queue: streams.Bounds{MaxBytes: 1 << 20}, Intake: streams.Bounds{MaxBytes: 1 << 20}})
	cfg, err := config.Parse([]byte(`
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: fast, rpm: 100000, tpm: 100000000}, {name: slow, rpm: 2, tpm: 100000000}]
tenants: [{name: acme}, {name: beta}]
queues:
  queue: {max_bytes: 1048576}
  intake: {max_bytes: 1048576}
`))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(Config{App: cfg}, m, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	svc.acceptor.queueShare.bound.Store(256 << 10)
	svc.intake.intakeShare.bound.Store(256 << 10)
	return &fixture{svc: svc, mesh: m, js: m.JS, nc: m.JS.Conn()}
}

// bigJob is a job of about 100 KiB on model.
func bigJob(tenant, model string) *task.Task {
	return &task.Task{
		Job: job.Job{ID: job.NewID(), Tenant: tenant, Request: json.RawMessage(`{"model":"` + model +
			`","max_tokens":16,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 100<<10/5) + `"}]}`)},
	}
}

// One tenant's large jobs on a slow model fill only its own share of
// QUEUE's bytes: its next job is refused with an error naming the tenant
// bound and a wait for its own jobs ahead, while the other tenant's jobs,
// large or small, are accepted.
func TestTenantBytesLeaveOthersAccepted(t *testing.T) {
	t.Parallel()
	f := setupBytes(t)
	ctx := context.Background()
	accepted := 0
	var refusal error
	for range 5 {
		if _, err := f.svc.Accept(ctx, bigJob("acme", "slow")); err != nil {
			refusal = err
			break
		}
		accepted++
	}
	var be *BusyError
	if !errors.As(refusal, &be) || !strings.Contains(be.Message, "queues.queue.max_bytes_per_tenant") || !strings.Contains(be.Message, `"acme"`) {
		t.Fatalf("acme's large jobs: %d accepted, then %v; want a refusal naming acme's bound", accepted, refusal)
	}
	if accepted != 2 {
		t.Errorf("acme had %d jobs of 100 KiB accepted under a 256 KiB bound, want 2", accepted)
	}
	// Two jobs ahead at 2 requests a minute: about 90 s, not 1 s.
	if be.RetryAfter < 60*time.Second {
		t.Errorf("acme's suggested wait %s; want the time its own jobs ahead take on the slow model (about 90 s)", be.RetryAfter)
	}
	for i, j := range []*task.Task{bigJob("beta", "fast"), bigJob("beta", "slow"), newJob("beta", "")} {
		if _, err := f.svc.Accept(ctx, j); err != nil {
			t.Errorf("beta's job %d after acme filled its share: %v, want accepted", i+1, err)
		}
	}
	// Over HTTP, acme's refusal is a 429 that names the bound.
	mux := http.NewServeMux()
	f.svc.Routes(mux, api.Auth{Tenants: []string{"acme", "beta"}, Open: true})
	body, _ := json.Marshal(map[string]any{"request": bigJob("acme", "slow").Request})
	req := httptest.NewRequest(http.MethodPost, "/v1/jobs", strings.NewReader(string(body)))
	req.Header.Set("X-Sluice-Tenant", "acme")
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "max_bytes_per_tenant") {
		t.Errorf("POST /v1/jobs over acme's bound: %d %.300s; want 429 naming the bound", rec.Code, rec.Body)
	}
}

// A tenant's jobs waiting in INTAKE beyond its share of INTAKE's bytes are
// refused, not kept, so they cannot keep the other tenants out of INTAKE.
func TestTenantBytesInIntakeAreBounded(t *testing.T) {
	t.Parallel()
	f := setupBytes(t)
	// acme's QUEUE share is full.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 2 {
		if _, err := f.svc.Accept(ctx, bigJob("acme", "slow")); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := f.nc.SubscribeSync(job.ResultPrefix + "acme.>")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	for i := range 4 {
		data, _ := json.Marshal(bigJob("acme", "slow"))
		if _, err := f.js.Publish(ctx, job.IntakeSubject("acme"), data); err != nil {
			t.Fatalf("acme's intake job %d: %v", i+1, err)
		}
	}
	f.run(t)
	// Two fit acme's 256 KiB of INTAKE and wait; the rest are refused.
	m, err := sub.NextMsg(45 * time.Second)
	if err != nil {
		t.Fatalf("no refusal for acme's jobs beyond its INTAKE share: %v", err)
	}
	var r job.Result
	if json.Unmarshal(m.Data, &r) != nil || r.Error == nil || r.Error.Code != job.CodeQueueFull || !strings.Contains(r.Error.Message, "queues.intake.max_bytes_per_tenant") {
		t.Fatalf("refusal %s; want queue_full naming queues.intake.max_bytes_per_tenant", m.Data)
	}
	st, err := f.js.Stream(ctx, streams.Intake)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 45*time.Second, func() error { return intakeWithin(ctx, st, 256<<10) })
	// beta still gets in.
	data, _ := json.Marshal(bigJob("beta", "fast"))
	if _, err := f.js.Publish(ctx, job.IntakeSubject("beta"), data); err != nil {
		t.Errorf("beta's intake job after acme's flood: %v, want stored", err)
	}
}

// The same holds when QUEUE is full as a whole, so that a job has its
// records and waits in INTAKE for room: a tenant's jobs past its INTAKE
// share are refused (with a stored result, since they had records), the
// ones within it wait, and the other tenant's submissions are still
// stored by INTAKE.
func TestIntakeShareWhenQueueIsFull(t *testing.T) {
	t.Parallel()
	f := setupBytes(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// QUEUE full as a whole, by a tenant ingest never sees.
	filler := make([]byte, 200<<10)
	for {
		if _, err := f.js.Publish(ctx, job.QueueSubject(job.Standard, "zeta"), filler); err != nil {
			if !mesh.IsStreamFull(err) {
				t.Fatal(err)
			}
			break
		}
	}
	f.run(t)
	var sent []*task.Task
	for range 10 {
		j := bigJob("acme", "fast")
		data, _ := json.Marshal(j)
		if _, err := f.js.Publish(ctx, job.IntakeSubject("acme"), data); err == nil {
			sent = append(sent, j)
		}
	}
	st, err := f.js.Stream(ctx, streams.Intake)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 45*time.Second, func() error { return intakeWithin(ctx, st, 256<<10) })
	refused := 0
	for _, j := range sent {
		if r, err := f.mesh.StoredResult(ctx, "acme", j.ID); err == nil {
			if r.Error == nil || r.Error.Code != job.CodeQueueFull || !strings.Contains(r.Error.Message, "queues.intake.max_bytes_per_tenant") {
				t.Errorf("acme's stored refusal %+v; want queue_full naming queues.intake.max_bytes_per_tenant", r)
			}
			refused++
		}
	}
	if refused == 0 {
		t.Errorf("none of acme's %d stored jobs was refused; want those past its share", len(sent))
	}
	for i := range 2 {
		data, _ := json.Marshal(bigJob("beta", "fast"))
		if _, err := f.js.Publish(ctx, job.IntakeSubject("beta"), data); err != nil {
			t.Errorf("beta's intake job %d after acme's flood: %v, want stored", i+1, err)
		}
	}
}

// intakeWithin says whether INTAKE holds at most bound bytes.
func intakeWithin(ctx context.Context, st jetstream.Stream, bound uint64) error {
	info, err := st.Info(ctx)
	if err == nil && info.State.Bytes > bound {
		err = fmt.Errorf("INTAKE holds %d bytes of acme's; want at most its %d-byte share", info.State.Bytes, bound)
	}
	return err
}

// A tenant mixing tiny jobs, which leave QUEUE at once, with large ones,
// which wait, never holds more than its bound in QUEUE: what bounds it is
// the jobs still there, not the sizes of its latest (mostly tiny) jobs.
func TestTenantBytesExactWithMixedSizes(t *testing.T) {
	t.Parallel()
	f := setupBytes(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clock := time.Now()
	f.svc.now = func() time.Time { return clock }
	st, err := f.js.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	const bound = 256 << 10
	big := 0
	for i := range 40 {
		clock = clock.Add(2 * time.Second) // every accept after a refresh
		if i%4 == 0 {
			if _, err := f.svc.Accept(ctx, bigJob("acme", "slow")); err == nil {
				big++
			} else if !errors.Is(err, ErrQueueFull) {
				t.Fatal(err)
			}
		} else {
			// A tiny job, admitted (taken off QUEUE) at once.
			j := newJob("acme", "")
			j.Priority = job.Interactive
			if _, err := f.svc.Accept(ctx, j); err != nil {
				t.Fatalf("acme's tiny job %d: %v", i, err)
			}
			m, err := st.GetLastMsgForSubject(ctx, job.QueueSubject(job.Interactive, "acme"))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.DeleteMsg(ctx, m.Sequence); err != nil {
				t.Fatal(err)
			}
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Bytes > bound {
			t.Fatalf("after %d jobs (%d large accepted), acme holds %d bytes in QUEUE, over its %d-byte bound", i+1, big, info.State.Bytes, bound)
		}
	}
	if big != 2 {
		t.Errorf("%d large jobs of 100 KiB accepted under a 256 KiB bound, want 2", big)
	}
}

// The bound on what a job takes in QUEUE is at least what the stream counts.
func TestEnvelopeSizeBoundsStoredSize(t *testing.T) {
	t.Parallel()
	f := setupBytes(t)
	ctx := context.Background()
	j := newJob("acme", "key")
	j.Deadline = new(time.Now().Add(time.Hour))
	if _, err := f.svc.Accept(ctx, j); err != nil {
		t.Fatal(err)
	}
	st, err := f.js.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, bound := info.State.Bytes, envelopeSize(j); got > uint64(bound) {
		t.Errorf("a job takes %d bytes in QUEUE, above envelopeSize's %d", got, bound)
	}
}

// A ledger folded to its bound of groups still bounds the bytes of the
// jobs that wait, whichever of them do.
func TestLedgerFoldedStillBounds(t *testing.T) {
	t.Parallel()
	var l ledger
	var sizes []int64
	for i := range 3 * ledgerGroups {
		size := int64(100)
		if i%7 == 0 {
			size = 10_000
		}
		sizes = append(sizes, size)
		l.add(uint64(i+1), 0, size)
	}
	if len(l.groups) > ledgerGroups {
		t.Fatalf("ledger keeps %d groups, want at most %d", len(l.groups), ledgerGroups)
	}
	// The waiting jobs are the large ones from sequence 1000 on.
	var want int64
	var n uint64
	for i, size := range sizes {
		if i+1 >= 1000 && size > 100 {
			want += size
			n++
		}
	}
	l.settle(0, uint64(len(sizes)), 1000, n, 100)
	if l.base < want {
		t.Errorf("folded ledger bounds %d waiting jobs at %d bytes, below their %d", n, l.base, want)
	}
}
