package batches

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/ingest"
	"github.com/sluice-dev/sluice/streams"
)

// A line's job id is a canonical UUIDv7 of the batch's time, the same for
// the same batch and custom_id and different otherwise; so is its
// idempotency key.
func TestLineJob(t *testing.T) {
	t.Parallel()
	b := &batchRecord{ID: newBatchID(), CreatedAt: time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC).Unix()}
	id, key := lineJob(b, "req-1")
	id2, key2 := lineJob(b, "req-1")
	other, otherKey := lineJob(b, "req-2")
	if !job.CanonicalID(id) || id != id2 || key != key2 {
		t.Fatalf("lineJob: got %s/%s then %s/%s, want one canonical id and key", id, key, id2, key2)
	}
	if other == id || otherKey == key {
		t.Errorf("another custom_id: got %s/%s, want a different job", other, otherKey)
	}
	u := uuid.MustParse(id)
	if u.Version() != 7 || time.Unix(u.Time().UnixTime()).Unix() != b.CreatedAt {
		t.Errorf("id %s: version %d, time %v; want 7 and the batch's", id, u.Version(), time.Unix(u.Time().UnixTime()))
	}
	if _, otherBatch := lineJob(&batchRecord{ID: newBatchID(), CreatedAt: b.CreatedAt}, "req-1"); otherBatch == key {
		t.Error("another batch's line has the same idempotency key")
	}
}

// limitReader passes up to its bound and fails past it.
func TestLimitReader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n, limit int64
		over     bool
	}{{10, 10, false}, {11, 10, true}, {0, 10, false}, {5000, 4096, true}} {
		lr := &limitReader{r: bytes.NewReader(make([]byte, tc.n)), left: tc.limit}
		got, err := io.ReadAll(lr)
		if lr.over != tc.over || (err != nil) != tc.over || (!tc.over && int64(len(got)) != tc.n) {
			t.Errorf("%d bytes, bound %d: read %d, err %v, over %v; want over %v", tc.n, tc.limit, len(got), err, lr.over, tc.over)
		}
	}
}

// fakeAccept accepts jobs as ingest would record them, with a succeeded
// result at once, and remembers them; after stall jobs it stalls until its
// context ends (a process that dies mid-batch).
type fakeAccept struct {
	m     *mesh.Mesh
	stall int
	mu    sync.Mutex
	jobs  []job.Job
}

func (f *fakeAccept) Accept(ctx context.Context, j *task.Task) (ingest.Accepted, error) {
	f.mu.Lock()
	n := len(f.jobs)
	if f.stall > 0 && n >= f.stall {
		f.mu.Unlock()
		<-ctx.Done()
		return ingest.Accepted{}, ctx.Err()
	}
	f.jobs = append(f.jobs, j.Job)
	f.mu.Unlock()
	if strings.Contains(string(j.Request), "refuse me") {
		return ingest.Accepted{}, &job.ValidationError{Code: job.CodeTooLarge, Field: "request", Message: "above the model's limit"}
	}
	res := &job.Result{JobID: j.ID, Tenant: j.Tenant, Status: job.StatusSucceeded, Response: json.RawMessage(`{"object":"chat.completion","echo":` + string(j.Request) + `}`)}
	data, _ := json.Marshal(mesh.Record{JobID: j.ID, Tenant: j.Tenant, Status: job.StatusSucceeded, Result: res})
	if _, err := f.m.Results.Put(ctx, keys.Record(j.Tenant, j.ID), data); err != nil {
		return ingest.Accepted{}, err
	}
	return ingest.Accepted{JobID: j.ID, Tenant: j.Tenant}, nil
}

func (f *fakeAccept) seen() []job.Job {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]job.Job(nil), f.jobs...)
}

// setupMesh is an embedded JetStream with Sluice's objects.
func setupMesh(t *testing.T) *mesh.Mesh {
	t.Helper()
	js, err := jetstream.New(natstest.Conn(t, natstest.Server(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	m, err := mesh.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A runner that stops holding a batch mid-submission (its process died)
// loses it when its lease lapses; another takes it over, submits the rest
// as the same jobs (ids and idempotency keys) and completes it, with every
// line once in the output file.
func TestTakeover(t *testing.T) {
	t.Parallel()
	m := setupMesh(t)
	app, err := config.Parse([]byte("tenants: [{name: acme}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	first := &fakeAccept{m: m, stall: 5}
	a := New(Config{App: app, Holder: "a"}, m, first, log)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const lines = 12
	var input strings.Builder
	for i := range lines {
		fmt.Fprintf(&input, `{"custom_id":"c%d","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"%d"}]}}`+"\n", i, i)
	}
	f := &fileRecord{ID: newFileID(), Tenant: "acme", Purpose: PurposeBatch}
	if err := a.files.put(ctx, f, strings.NewReader(input.String()), 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := a.files.record(ctx, f); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	b := &batchRecord{ID: newBatchID(), Tenant: "acme", InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h",
		Status: StatusValidating, Total: lines, CreatedAt: now.Unix(), ExpiresAt: now.Add(Window).Unix()}
	h := &handlers{deps: a.deps, files: a.files, wake: func() {}}
	if err := h.record(ctx, b); err != nil {
		t.Fatal(err)
	}
	actx, stopA := context.WithCancel(ctx)
	aDone := make(chan error, 1)
	go func() { aDone <- a.Run(actx) }()
	natstest.Eventually(t, 20*time.Second, func() error {
		if n := len(first.seen()); n < first.stall {
			return fmt.Errorf("runner a accepted %d lines", n)
		}
		return nil
	})
	stopA()
	if err := <-aDone; err != nil {
		t.Fatalf("runner a: %v", err)
	}
	early := New(Config{App: app, Holder: "c"}, m, &fakeAccept{m: m}, log)
	ekv, _, _ := early.stores(ctx)
	if early.runner.claim(ctx, ekv, "acme", b.ID) {
		t.Fatal("another runner claimed the batch while a's lease held")
	}
	second := &fakeAccept{m: m}
	later := func() time.Time { return time.Now().Add(LeaseTTL + time.Second) } // a's lease has lapsed
	bs := New(Config{App: app, Holder: "b", Now: later}, m, second, log)
	go func() { _ = bs.Run(ctx) }()
	kv, _, _ := bs.stores(ctx)
	var got *batchRecord
	natstest.Eventually(t, 30*time.Second, func() error {
		got, _, err = getBatch(ctx, kv, "acme", b.ID)
		if err != nil {
			return err
		}
		if got.Status != StatusCompleted {
			return fmt.Errorf("batch %s, owner %q, %d submitted", got.Status, got.Owner, got.Submitted)
		}
		return nil
	})
	if got.Completed != lines || got.Failed != 0 || got.Submitted != lines || got.ErrorFileID != "" {
		t.Errorf("batch: %d completed, %d failed, %d submitted, error file %q; want %d, 0, %d, none", got.Completed, got.Failed, got.Submitted, got.ErrorFileID, lines, lines)
	}
	byID := map[string]job.Job{}
	for _, j := range append(first.seen(), second.seen()...) {
		if prev, ok := byID[j.ID]; ok && prev.IdempotencyKey != j.IdempotencyKey {
			t.Errorf("job %s submitted with keys %q and %q", j.ID, prev.IdempotencyKey, j.IdempotencyKey)
		}
		if j.Priority != job.Batch || j.Deadline == nil || j.Deadline.Unix() != b.ExpiresAt || j.IdempotencyKey == "" {
			t.Errorf("job %s: priority %q, deadline %v, key %q; want batch, the window's end, a key", j.ID, j.Priority, j.Deadline, j.IdempotencyKey)
		}
		byID[j.ID] = j
	}
	if len(byID) != lines {
		t.Errorf("%d distinct jobs, want %d (one per line)", len(byID), lines)
	}
	checkOutput(t, ctx, bs, got, lines)
}

// checkOutput reads b's output file: each line once, in input order
// (custom ids c0 on), answered 200 by its own job.
func checkOutput(t *testing.T, ctx context.Context, bs *Service, got *batchRecord, lines int) {
	t.Helper()
	body, err := bs.files.open(ctx, "acme", got.OutputFileID)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	sc := bufio.NewScanner(body)
	var ids []string
	for sc.Scan() {
		var l struct {
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int    `json:"status_code"`
				RequestID  string `json:"request_id"`
			} `json:"response"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.Response.StatusCode != 200 {
			t.Errorf("output line %s: %v", sc.Text(), err)
		}
		if want, _ := lineJob(got, l.CustomID); l.Response.RequestID != want {
			t.Errorf("line %s: request_id %s, want its job %s", l.CustomID, l.Response.RequestID, want)
		}
		ids = append(ids, l.CustomID)
	}
	if want := fmt.Sprint(func() []string {
		var w []string
		for i := range lines {
			w = append(w, fmt.Sprintf("c%d", i))
		}
		return w
	}()); fmt.Sprint(ids) != want {
		t.Errorf("output custom ids %v, want %s in input order", ids, want)
	}
}

// makeBatch stores input as acme's file and records a batch of it made at
// now.
func makeBatch(t *testing.T, ctx context.Context, s *Service, input string, now time.Time) *batchRecord {
	t.Helper()
	f := &fileRecord{ID: newFileID(), Tenant: "acme", Purpose: PurposeBatch}
	if err := s.files.put(ctx, f, strings.NewReader(input), 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := s.files.record(ctx, f); err != nil {
		t.Fatal(err)
	}
	b := &batchRecord{ID: newBatchID(), Tenant: "acme", InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h",
		Status: StatusValidating, Total: strings.Count(input, "\n"), CreatedAt: now.Unix(), ExpiresAt: now.Add(Window).Unix()}
	h := &handlers{deps: s.deps, files: s.files, wake: func() {}}
	if err := h.record(ctx, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// waitEnded waits until the batch ends and returns it.
func waitEnded(t *testing.T, ctx context.Context, s *Service, id string) *batchRecord {
	t.Helper()
	kv, _, _ := s.stores(ctx)
	var b *batchRecord
	natstest.Eventually(t, 30*time.Second, func() error {
		var err error
		if b, _, err = getBatch(ctx, kv, "acme", id); err != nil {
			return err
		}
		if !b.ended() {
			return fmt.Errorf("batch %s", b.Status)
		}
		return nil
	})
	return b
}

// errorLines reads b's error file: custom_id -> line.
func errorLines(t *testing.T, ctx context.Context, s *Service, b *batchRecord) map[string]map[string]any {
	t.Helper()
	body, err := s.files.open(ctx, "acme", b.ErrorFileID)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	out := map[string]map[string]any{}
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		out[l["custom_id"].(string)] = l
	}
	return out
}

// A line accept refuses ends the batch's line failed, in the error file
// with its code and status; a batch whose window ended before its lines
// were submitted ends expired, each line batch_expired, none submitted.
func TestRefusedAndExpiredLines(t *testing.T) {
	t.Parallel()
	m := setupMesh(t)
	app, err := config.Parse([]byte("tenants: [{name: acme}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acc := &fakeAccept{m: m}
	s := New(Config{App: app}, m, acc, slog.New(slog.DiscardHandler))
	line := func(id, text string) string {
		return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":%q}]}}`+"\n", id, text)
	}
	b := makeBatch(t, ctx, s, line("ok", "hello")+line("big", "refuse me")+line("ok2", "hello"), time.Now())
	expired := makeBatch(t, ctx, s, line("late", "too late"), time.Now().Add(-Window-time.Minute))
	go func() { _ = s.Run(ctx) }()
	got := waitEnded(t, ctx, s, b.ID)
	if got.Status != StatusCompleted || got.Completed != 2 || got.Failed != 1 {
		t.Errorf("batch: %s, %d completed, %d failed; want completed, 2 and 1", got.Status, got.Completed, got.Failed)
	}
	errs := errorLines(t, ctx, s, got)
	resp, _ := errs["big"]["response"].(map[string]any)
	body, _ := resp["body"].(map[string]any)
	if e, _ := body["error"].(map[string]any); len(errs) != 1 || resp["status_code"] != float64(413) || e["code"] != job.CodeTooLarge {
		t.Errorf("error file: %v; want the refused line, 413 %s", errs, job.CodeTooLarge)
	}
	got = waitEnded(t, ctx, s, expired.ID)
	if got.Status != StatusExpired || got.ExpiredAt == 0 || got.Failed != 1 || got.Submitted != 0 {
		t.Errorf("expired batch: %s, %d failed, %d submitted; want expired, 1, 0", got.Status, got.Failed, got.Submitted)
	}
	if e, _ := errorLines(t, ctx, s, got)["late"]["error"].(map[string]any); e["code"] != "batch_expired" {
		t.Errorf("expired line: %v, want batch_expired", e)
	}
	for _, j := range acc.seen() {
		if strings.Contains(string(j.Request), "too late") {
			t.Error("a line of the expired batch was submitted")
		}
	}
}
