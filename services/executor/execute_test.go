package executor

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// scripted is a provider client that answers from a script and counts the
// calls that reached it.
type scripted struct {
	mu     sync.Mutex
	calls  int
	answer func() (*provider.Response, error)
}

func (c *scripted) Do(context.Context, provider.Call) (*provider.Response, error) {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	return c.answer()
}

func (c *scripted) made() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// dispatched is a DISPATCH message as execute sees it, on its first
// delivery; it records how it was settled.
type dispatched struct {
	jetstream.Msg
	mu      sync.Mutex
	settled []string
	seq     uint64 // its DISPATCH sequence (0: 7)
}

func (m *dispatched) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{NumDelivered: 1, Sequence: jetstream.SequencePair{Stream: max(m.seq, 7)}}, nil
}
func (m *dispatched) InProgress() error { return nil }

// fixture is an executor, not running, on an embedded server: provider p,
// model m, tenant t (and tenant one, at most one call at a time); its
// steps are driven directly.
type fixture struct {
	s      *Service
	m      *mesh.Mesh
	client *scripted
}

func setup(t *testing.T, answer func() (*provider.Response, error)) *fixture {
	t.Helper()
	return setupWith(t, `
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: m, rpm: 1000, tpm: 1000000}]
tenants: [{name: t}, {name: one, max_concurrency: 1}]
`, answer)
}

// setupWith is setup with configuration yaml, whose providers' clients all
// answer with answer.
func setupWith(t *testing.T, yaml string, answer func() (*provider.Response, error)) *fixture {
	t.Helper()
	m := meshtest.New(t, streams.Options{})
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	c := &scripted{answer: answer}
	clients := map[string]provider.Client{}
	for _, p := range cfg.Providers {
		clients[p.Name] = c
	}
	s, err := New(Config{App: cfg, Clients: clients, Guard: guard.New(cfg, make([]byte, 32))},
		m, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{s: s, m: m, client: c}
}

// job is a job of tenant as admission dispatches it (unpaced), with its
// operation record queued as ingest leaves it.
func (f *fixture) job(t *testing.T, tenant string) *task.Task {
	t.Helper()
	now := time.Now().UTC()
	j := &task.Task{
		Job:         job.Job{ID: job.NewID(), Tenant: tenant, Priority: job.Standard, Provider: "p", Endpoint: "/v1/chat/completions", Request: json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)},
		Model:       "m",
		Estimate:    &job.Estimate{PromptTokens: 10, MaxTokens: 16},
		Reservation: &task.Reservation{ID: "1-0", Requests: 1, Tokens: 26, ReservedAt: now, ValidUntil: now.Add(time.Minute)},
		SubmittedAt: now,
		Gated:       true,
	}
	opKey, key := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	data, _ := json.Marshal(mesh.OpRecord{Key: key, JobID: j.ID, Tenant: j.Tenant, State: mesh.OpQueued})
	if _, err := f.m.Idempotency.Create(context.Background(), opKey, data); err != nil {
		t.Fatal(err)
	}
	return j
}

func (f *fixture) op(t *testing.T, j *task.Task) *mesh.OpRecord {
	t.Helper()
	opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	r, _, err := f.m.GetOp(context.Background(), opKey)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// queued returns the job QUEUE holds now (one is expected).
func (f *fixture) queued(t *testing.T) *task.Task {
	t.Helper()
	ctx := context.Background()
	st, err := f.m.JS.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := st.GetLastMsgForSubject(ctx, job.QueuePrefix+">")
	if err != nil {
		t.Fatalf("QUEUE: %v; want the job sent back", err)
	}
	var j task.Task
	if err := json.Unmarshal(msg.Data, &j); err != nil {
		t.Fatal(err)
	}
	return &j
}

func (f *fixture) result(t *testing.T, j *task.Task) *job.Result {
	t.Helper()
	r, err := f.m.StoredResult(context.Background(), j.Tenant, j.ID)
	if err != nil {
		t.Fatalf("result of %s: %v; want one stored", j.ID, err)
	}
	return r
}

func count(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

func answer(status int, header http.Header, body string) func() (*provider.Response, error) {
	return func() (*provider.Response, error) {
		if header == nil {
			header = http.Header{}
		}
		return &provider.Response{Status: status, Header: header, Body: []byte(body), Usage: job.Usage{PromptTokens: 10, CompletionTokens: 2}}, nil
	}
}

const okBody = `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2}}`

func TestExecuteSucceeds(t *testing.T) {
	t.Parallel()
	f := setup(t, answer(200, nil, okBody))
	j := f.job(t, "t")
	if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
		t.Fatal(err)
	}
	if n := f.client.made(); n != 1 {
		t.Fatalf("provider calls %d, want 1", n)
	}
	r := f.result(t, j)
	if r.Status != job.StatusSucceeded || r.Attempts != 1 || string(r.Response) != okBody {
		t.Fatalf("result %s after %d attempts (%s), want succeeded after 1 with the provider's body", r.Status, r.Attempts, r.Response)
	}
	if op := f.op(t, j); op.State != mesh.OpInFlight || op.Sent == nil {
		t.Fatalf("operation %s, sent %v; want in flight with its call marked sent until the result service settles it", op.State, op.Sent)
	}
	if j.Gated {
		t.Fatal("job still gated after its call; want a later attempt to pay the tenant's budgets again")
	}
}

func TestExecuteDoneOperationIsNotCalledAgain(t *testing.T) {
	t.Parallel()
	f := setup(t, answer(200, nil, okBody))
	j := f.job(t, "t")
	opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	if _, err := f.m.UpdateOp(context.Background(), opKey, func(r *mesh.OpRecord) bool { r.State = mesh.OpCompleted; return true }); err != nil {
		t.Fatal(err)
	}
	if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
		t.Fatal(err)
	}
	if n := f.client.made(); n != 0 {
		t.Fatalf("provider calls %d, want 0: the operation was completed", n)
	}
	if got := count(f.s.m.DupSuppressed.WithLabelValues(f.s.cfg.App.TaskLabel(j.Task))); got != 1 {
		t.Fatalf("duplicates suppressed %v, want 1", got)
	}
}

// TestExecuteLostCallEndsUnknown: an earlier delivery's call left (its mark
// is in the record) and its outcome was never recorded: past the call's
// bound the job ends outcome_unknown, and the provider is not called again.
func TestExecuteLostCallEndsUnknown(t *testing.T) {
	t.Parallel()
	f := setup(t, answer(200, nil, okBody))
	j := f.job(t, "t")
	opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	long := time.Now().Add(-time.Hour).UTC()
	if _, err := f.m.UpdateOp(context.Background(), opKey, func(r *mesh.OpRecord) bool {
		r.State, r.Sent = mesh.OpInFlight, &mesh.SentMark{Attempt: 1, At: long, By: "another-executor", Reservation: "0-0"}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
		t.Fatal(err)
	}
	if n := f.client.made(); n != 0 {
		t.Fatalf("provider calls %d, want 0: the lost call may have been paid", n)
	}
	if r := f.result(t, j); r.Status != job.StatusFailed || r.Error == nil || r.Error.Code != "outcome_unknown" {
		t.Fatalf("result %s (%+v), want failed outcome_unknown", r.Status, r.Error)
	}
}

func TestExecuteReadmitsALapsedReservation(t *testing.T) {
	t.Parallel()
	f := setup(t, answer(200, nil, okBody))
	j := f.job(t, "t")
	j.Reservation.ValidUntil = time.Now().Add(-time.Second).UTC()
	if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
		t.Fatal(err)
	}
	if n := f.client.made(); n != 0 {
		t.Fatalf("provider calls %d, want 0", n)
	}
	if q := f.queued(t); q.ID != j.ID || q.Reservation != nil {
		t.Fatalf("queued %s with reservation %+v; want %s without one", q.ID, q.Reservation, j.ID)
	}
	if got := count(f.s.m.ReservationsExpired.WithLabelValues("p", "m")); got != 1 {
		t.Fatalf("reservations expired %v, want 1", got)
	}
	if op := f.op(t, j); op.State != mesh.OpQueued {
		t.Fatalf("operation %s, want still queued (never claimed)", op.State)
	}
}

func TestExecuteRetryGoesBackToQueue(t *testing.T) {
	t.Parallel()
	f := setup(t, answer(503, nil, `{"error":{"type":"overloaded_error","message":"busy"}}`))
	j := f.job(t, "t")
	if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
		t.Fatal(err)
	}
	q := f.queued(t)
	if q.NotBefore == nil || q.Reservation != nil || len(q.Attempts) != 1 || q.Attempts[0].Status != 503 {
		t.Fatalf("queued with not_before %v, reservation %+v, attempts %+v; want a later not_before, no reservation, the 503 attempt", q.NotBefore, q.Reservation, q.Attempts)
	}
	if op := f.op(t, j); op.State != mesh.OpQueued || op.Sent != nil {
		t.Fatalf("operation %s, sent %v; want queued again with no sent mark", op.State, op.Sent)
	}
}

// TestExecuteThrottledSpendsNoAttempt: a 429 of a call Sluice admitted is
// Sluice's misjudgement: the job goes back without an attempt spent.
func TestExecuteThrottledSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	h := http.Header{"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Limit-Tokens": {"1000"}}
	f := setup(t, answer(429, h, `{"error":{"type":"tokens","code":"rate_limit_exceeded","message":"Rate limit reached"}}`))
	j := f.job(t, "t")
	if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
		t.Fatal(err)
	}
	q := f.queued(t)
	if len(q.Attempts) != 0 || q.RateLimited != 1 || q.Reservation != nil {
		t.Fatalf("queued with attempts %+v, rate limited %d, reservation %+v; want no attempt, 1 refusal, no reservation", q.Attempts, q.RateLimited, q.Reservation)
	}
	if got := count(f.s.m.Requests.WithLabelValues("p", "m", "429")); got != 1 {
		t.Fatalf("requests counted with status 429: %v, want 1", got)
	}
}

// TestExecuteWithoutTenantSlotWaits: tenant one is at its concurrency cap
// (this process holds no lease of its slots): the job goes back to
// admission a little later, not called.
func TestExecuteWithoutTenantSlotWaits(t *testing.T) {
	t.Parallel()
	f := setup(t, answer(200, nil, okBody))
	j := f.job(t, "one")
	before := time.Now()
	if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
		t.Fatal(err)
	}
	if n := f.client.made(); n != 0 {
		t.Fatalf("provider calls %d, want 0", n)
	}
	q := f.queued(t)
	if q.NotBefore == nil || q.NotBefore.Before(before) || q.Reservation != nil {
		t.Fatalf("queued with not_before %v, reservation %+v; want a not_before ahead and no reservation", q.NotBefore, q.Reservation)
	}
	if op := f.op(t, j); op.State != mesh.OpQueued || op.Sent != nil {
		t.Fatalf("operation %s, sent %v; want queued again with no sent mark", op.State, op.Sent)
	}
}

func TestExecuteExpiredIsNeverCalled(t *testing.T) {
	t.Parallel()
	f := setup(t, answer(200, nil, okBody))
	j := f.job(t, "t")
	past := time.Now().Add(-time.Second).UTC()
	j.Deadline = &past
	if err := f.s.execute(context.Background(), &dispatched{}, j); err != nil {
		t.Fatal(err)
	}
	if n := f.client.made(); n != 0 {
		t.Fatalf("provider calls %d, want 0", n)
	}
	if r := f.result(t, j); r.Status != job.StatusExpired {
		t.Fatalf("result %s, want expired", r.Status)
	}
}
