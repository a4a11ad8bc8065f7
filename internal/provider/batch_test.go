package provider

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/fakeclock"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// batchSetup is a simulator serving both Batch APIs over real HTTP on
// 127.0.0.1, its clock in the test's hand, and batch clients of every kind
// pointed at it.
type batchSetup struct {
	sim    *sim.Server
	clock  *fakeclock.Clock
	url    string
	polls  atomic.Int64 // GETs of a batch's status
	calls  atomic.Int64 // every request
	client map[string]BatchClient
}

const (
	batchModel     = "gpt-4o-mini"
	batchClaude    = "claude-3-5-haiku-latest"
	batchDeploy    = "gpt-4o-mini-batch"
	batchAzureKey  = "azure-key-1"
	batchAPIVersio = "2024-10-21"
)

func newBatchSetup(t *testing.T, bc sim.BatchConfig, lim BatchLimits, profile string) *batchSetup {
	t.Helper()
	s := &batchSetup{clock: fakeclock.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))}
	cfg := sim.Config{Models: []sim.ModelLimits{{Name: batchModel, RPM: 60, TPM: 10000}, {Name: batchClaude, RPM: 60, ITPM: 10000, OTPM: 10000}, {Name: batchDeploy, RPM: 60, TPM: 10000}},
		Profile: profile, Batch: bc, Now: s.clock.Now}
	var err error
	if s.sim, err = sim.New(cfg); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.calls.Add(1)
		if r.Method == http.MethodGet && strings.Count(strings.TrimPrefix(r.URL.Path, "/"), "/") == 2+strings.Count(r.URL.Path, "/messages/") {
			s.polls.Add(1)
		}
		s.sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	sync := map[string]Client{
		"openai":    NewOpenAI(OpenAIConfig{BaseURL: srv.URL + "/v1", APIKey: "sk-test"}),
		"anthropic": NewAnthropic(AnthropicConfig{BaseURL: srv.URL + "/v1", APIKey: "ak-test"}),
	}
	if profile == sim.ProfileAzure {
		sync["azure"] = NewAzure(AzureConfig{BaseURL: srv.URL, APIKey: batchAzureKey, APIVersion: batchAPIVersio})
	}
	s.client = map[string]BatchClient{}
	for kind, c := range sync {
		b, ok := BatchesOf(c, lim)
		if !ok {
			t.Fatalf("%s: no batch client", kind)
		}
		s.client[kind] = b
	}
	return s
}

// noBatches is a Client of a provider without a Batch API.
type noBatches struct{}

func (noBatches) Do(context.Context, Call) (*Response, error) { return nil, nil }

func TestBatchesOfOthers(t *testing.T) {
	t.Parallel()
	if b, ok := BatchesOf(noBatches{}, BatchLimits{}); ok || b != nil {
		t.Errorf("a client without a Batch API: got %v, %v; want none", b, ok)
	}
}

// model is the model a kind's batch is for.
func batchModelOf(kind string) string {
	switch kind {
	case "anthropic":
		return batchClaude
	case "azure":
		return batchDeploy
	}
	return batchModel
}

// lines are n chat lines c0..c(n-1) for model.
func batchLines(model string, n int) []BatchLine {
	out := make([]BatchLine, n)
	for i := range out {
		out[i] = BatchLine{CustomID: fmt.Sprintf("c%d", i), Body: []byte(fmt.Sprintf(`{"model":%q,"max_tokens":40,"messages":[{"role":"user","content":"question %d"}]}`, model, i))}
	}
	return out
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// byID maps results by custom id, failing on a duplicate.
func byID(t *testing.T, rs []BatchResult) map[string]BatchResult {
	t.Helper()
	m := map[string]BatchResult{}
	for _, r := range rs {
		if _, dup := m[r.CustomID]; dup {
			t.Fatalf("custom id %s answered twice", r.CustomID)
		}
		m[r.CustomID] = r
	}
	return m
}

// TestBatchRoundTrip: each kind of batch client submits lines, follows the
// batch to its end and maps every result back by custom id: answered lines
// with their chat.completion and usage (the simulator's ledger bills
// exactly those tokens, once), an invalid line errored and classified as
// the synchronous call's 400 would be. The batch work spent nothing of the
// models' synchronous limits.
func TestBatchRoundTrip(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"openai", "anthropic", "azure"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := newBatchSetup(t, sim.BatchConfig{Duration: 10 * time.Second}, BatchLimits{}, sim.ProfileAzure)
			c, ctx, model := s.client[kind], ctxT(t), batchModelOf(kind)
			lines := batchLines(model, 4)
			bad := `{"model":%q,"messages":[]}` // no messages: refused as a synchronous call would be
			if kind == "anthropic" {
				bad = `{"model":%q,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","budget_tokens":10}}`
			}
			lines = append(lines, BatchLine{CustomID: "bad", Body: []byte(fmt.Sprintf(bad, model))})
			b, err := c.Submit(ctx, BatchRequest{Model: model, Lines: lines})
			if err != nil {
				t.Fatal(err)
			}
			if b.State != BatchRunning || b.ID == "" {
				t.Fatalf("submitted: got %+v, want a running batch with an id", b)
			}
			if _, err := c.Results(ctx, b.ID); !errors.Is(err, ErrBatchNotEnded) {
				t.Fatalf("results of a running batch: got %v, want ErrBatchNotEnded", err)
			}
			s.clock.Advance(12 * time.Second) // every line, and OpenAI's finalizing
			if b, err = c.Status(ctx, b.ID); err != nil || b.State != BatchEnded || b.Total != 5 || b.Done != 5 {
				t.Fatalf("status: got %+v, %v; want ended, 5 of 5 done", b, err)
			}
			rs, err := c.Results(ctx, b.ID)
			if err != nil {
				t.Fatal(err)
			}
			got := byID(t, rs)
			billed := map[string]int{}
			for _, l := range s.sim.BatchLines() {
				billed[l.CustomID] += l.InputTokens + l.OutputTokens
			}
			for _, l := range lines[:4] {
				r := got[l.CustomID]
				if r.Result != LineSucceeded || !strings.Contains(string(r.Body), `"chat.completion"`) || r.Usage.PromptTokens == 0 || r.Usage.CompletionTokens == 0 {
					t.Errorf("%s: got %v %+v %s, want succeeded with a chat.completion and usage", l.CustomID, r.Result, r.Usage, r.Body)
				}
				if billed[l.CustomID] != r.Usage.PromptTokens+r.Usage.CompletionTokens {
					t.Errorf("%s: the provider billed %d tokens, the result says %+v", l.CustomID, billed[l.CustomID], r.Usage)
				}
			}
			if r := got["bad"]; r.Result != LineErrored || r.Outcome.Class != Fail || r.Outcome.HTTPStatus != 400 || billed["bad"] != 0 {
				t.Errorf("bad line: got %v %+v (billed %d), want errored, classified invalid (400), billed nothing", r.Result, r.Outcome, billed["bad"])
			}
			if n := len(s.sim.BatchLines()); n != 5 {
				t.Errorf("ledger: got %d lines, want 5 (each line once)", n)
			}
			for name, m := range s.sim.Stats().Models {
				if m.MaxRequestsIn60s != 0 || m.MaxTokensIn60s != 0 {
					t.Errorf("model %s: the batch spent synchronous limits: %d requests, %d tokens", name, m.MaxRequestsIn60s, m.MaxTokensIn60s)
				}
			}
		})
	}
}

// TestBatchCancelKeepsCompleted: a batch cancelled midway keeps the lines
// that completed, including the one in progress when the cancel came;
// CancelAndWait returns only once the cancellation has finished, and the
// rest come back cancelled, never billed.
func TestBatchCancelKeepsCompleted(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"openai", "anthropic"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := newBatchSetup(t, sim.BatchConfig{Duration: 10 * time.Second}, BatchLimits{}, "")
			c, ctx, model := s.client[kind], ctxT(t), batchModelOf(kind)
			b, err := c.Submit(ctx, BatchRequest{Model: model, Lines: batchLines(model, 10)})
			if err != nil {
				t.Fatal(err)
			}
			s.clock.Advance(3500 * time.Millisecond) // c0..c2 done (1 s apart), c3 in progress
			type waited struct {
				b   Batch
				err error
			}
			done := make(chan waited, 1)
			go func() {
				b, err := CancelAndWait(ctx, c, b.ID, 5*time.Millisecond)
				done <- waited{b, err}
			}()
			// It keeps polling a cancelling batch, and does not return.
			before := s.polls.Load()
			natstest.Eventually(t, 10*time.Second, func() error {
				select {
				case w := <-done:
					t.Fatalf("CancelAndWait returned while the batch was cancelling: %+v, %v", w.b, w.err)
				default:
				}
				if n := s.polls.Load() - before; n < 3 {
					return fmt.Errorf("%d status polls while cancelling", n)
				}
				return nil
			})
			if _, err := c.Results(ctx, b.ID); !errors.Is(err, ErrBatchNotEnded) {
				t.Fatalf("results while cancelling: got %v, want ErrBatchNotEnded", err)
			}
			s.clock.Advance(time.Second) // c3 finishes; the cancellation with it
			var w waited
			select {
			case w = <-done:
			case <-ctx.Done():
				t.Fatal("CancelAndWait did not return once the cancellation finished")
			}
			if w.err != nil || w.b.State != BatchEnded {
				t.Fatalf("CancelAndWait: got %+v, %v; want ended", w.b, w.err)
			}
			rs, err := c.Results(ctx, b.ID)
			if err != nil {
				t.Fatal(err)
			}
			got := byID(t, rs)
			for i := range 10 {
				id, want := fmt.Sprintf("c%d", i), LineCancelled
				if i <= 3 {
					want = LineSucceeded
				}
				if got[id].Result != want {
					t.Errorf("%s: got %v, want %v", id, got[id].Result, want)
				}
			}
			var paid []string
			for _, l := range s.sim.BatchLines() {
				if l.InputTokens+l.OutputTokens > 0 {
					paid = append(paid, l.CustomID)
				}
			}
			slices.Sort(paid)
			if want := []string{"c0", "c1", "c2", "c3"}; !slices.Equal(paid, want) {
				t.Errorf("billed lines: got %v, want %v", paid, want)
			}
		})
	}
}

// TestBatchExpiry: lines not answered when the batch's window ends come
// back expired, the others answered.
func TestBatchExpiry(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"openai", "anthropic"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := newBatchSetup(t, sim.BatchConfig{Duration: 10 * time.Second, Expiry: 5500 * time.Millisecond}, BatchLimits{}, "")
			c, ctx, model := s.client[kind], ctxT(t), batchModelOf(kind)
			b, err := c.Submit(ctx, BatchRequest{Model: model, Lines: batchLines(model, 10)})
			if err != nil {
				t.Fatal(err)
			}
			s.clock.Advance(6 * time.Second)
			if b, err = c.Status(ctx, b.ID); err != nil || b.State != BatchEnded {
				t.Fatalf("status after the window: got %+v, %v; want ended", b, err)
			}
			rs, err := c.Results(ctx, b.ID)
			if err != nil {
				t.Fatal(err)
			}
			got, n := byID(t, rs), map[LineResult]int{}
			for _, r := range got {
				n[r.Result]++
			}
			if n[LineSucceeded] != 5 || n[LineExpired] != 5 || got["c4"].Result != LineSucceeded || got["c5"].Result != LineExpired {
				t.Errorf("got %v (c4 %v, c5 %v), want 5 succeeded (c0..c4) and 5 expired", n, got["c4"].Result, got["c5"].Result)
			}
		})
	}
}

// TestOpenAIBatchTokenLimit: a batch that would take the model's enqueued
// tokens past the limit fails with token_limit_exceeded, which the client
// reports as ErrEnqueuedTokenLimit (nothing ran: put the jobs back to
// wait), and the same lines are taken once the batch ahead has ended.
func TestOpenAIBatchTokenLimit(t *testing.T) {
	t.Parallel()
	s := newBatchSetup(t, sim.BatchConfig{Duration: 10 * time.Second, EnqueuedTokens: 100}, BatchLimits{}, "")
	c, ctx := s.client["openai"], ctxT(t)
	first, err := c.Submit(ctx, BatchRequest{Model: batchModel, Lines: batchLines(batchModel, 5)})
	if err != nil {
		t.Fatal(err)
	}
	lines := batchLines(batchModel, 5)
	second, err := c.Submit(ctx, BatchRequest{Model: batchModel, Lines: lines})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Status(ctx, second.ID)
	if err != nil {
		t.Fatal(err)
	}
	var be *BatchError
	if b.State != BatchFailed || !errors.Is(b.Err, ErrEnqueuedTokenLimit) || !errors.As(b.Err, &be) || be.Code != "token_limit_exceeded" {
		t.Fatalf("second batch: got %+v, want failed with token_limit_exceeded (ErrEnqueuedTokenLimit)", b)
	}
	if errors.Is(b.Err, ErrBatchTooLarge) {
		t.Errorf("token_limit_exceeded also matched ErrBatchTooLarge")
	}
	if b, err := c.Status(ctx, first.ID); err != nil || b.State != BatchRunning {
		t.Fatalf("first batch: got %+v, %v; want it still running", b, err)
	}
	s.clock.Advance(12 * time.Second) // the first batch ends and frees its tokens
	third, err := c.Submit(ctx, BatchRequest{Model: batchModel, Lines: lines})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := c.Status(ctx, third.ID); err != nil || b.State != BatchRunning {
		t.Fatalf("the same lines later: got %+v, %v; want a running batch", b, err)
	}
	for _, l := range s.sim.BatchLines() {
		if l.BatchID == second.ID {
			t.Errorf("a line of the failed batch ran: %+v", l)
		}
	}
}

// TestAnthropicBatchQueueFull: a batch whose requests would pass the
// processing-queue limit is refused with a 429 the client reports as
// ErrBatchQueueFull (throttling, with the wait), and fits once lines ahead
// have been processed.
func TestAnthropicBatchQueueFull(t *testing.T) {
	t.Parallel()
	s := newBatchSetup(t, sim.BatchConfig{Duration: 4 * time.Second, QueueRequests: 5}, BatchLimits{}, "")
	c, ctx := s.client["anthropic"], ctxT(t)
	if _, err := c.Submit(ctx, BatchRequest{Model: batchClaude, Lines: batchLines(batchClaude, 4)}); err != nil {
		t.Fatal(err)
	}
	lines := batchLines(batchClaude, 2)
	_, err := c.Submit(ctx, BatchRequest{Model: batchClaude, Lines: lines})
	var he *BatchHTTPError
	if !errors.Is(err, ErrBatchQueueFull) || !errors.As(err, &he) || he.Outcome.Class != Retry || he.Outcome.RetryAfter <= 0 {
		t.Fatalf("over the queue: got %v, want ErrBatchQueueFull, a throttling answer with Retry-After", err)
	}
	s.clock.Advance(1 * time.Second) // one request of the first batch processed: 3 + 2 fit
	if _, err := c.Submit(ctx, BatchRequest{Model: batchClaude, Lines: lines}); err != nil {
		t.Fatalf("once the queue has room: %v", err)
	}
}

// TestBatchSizeLimits: a batch over the per-batch limits is refused
// clearly: by the client before anything is sent, and by the provider
// (OpenAI's too_many_tasks and file size, Anthropic's 413) when only it
// knows its limits.
func TestBatchSizeLimits(t *testing.T) {
	t.Parallel()
	// The client's own limits: nothing reaches the provider.
	s := newBatchSetup(t, sim.BatchConfig{}, BatchLimits{MaxRequests: 3, MaxBytes: 1 << 20}, "")
	for kind, c := range s.client {
		_, err := c.Submit(ctxT(t), BatchRequest{Model: batchModelOf(kind), Lines: batchLines(batchModelOf(kind), 4)})
		if !errors.Is(err, ErrBatchTooLarge) {
			t.Errorf("%s, 4 lines over a client limit of 3: got %v, want ErrBatchTooLarge", kind, err)
		}
	}
	if n := s.calls.Load(); n != 0 {
		t.Errorf("refused batches reached the provider: %d requests", n)
	}
	// The provider's limits.
	s = newBatchSetup(t, sim.BatchConfig{MaxRequests: 3}, BatchLimits{}, "")
	ctx := ctxT(t)
	b, err := s.client["openai"].Submit(ctx, BatchRequest{Model: batchModel, Lines: batchLines(batchModel, 4)})
	if err != nil {
		t.Fatal(err)
	}
	if b, err = s.client["openai"].Status(ctx, b.ID); b.State != BatchFailed || !errors.Is(b.Err, ErrBatchTooLarge) {
		t.Errorf("openai, 4 lines over the provider's 3: got %+v, %v; want failed, ErrBatchTooLarge", b, err)
	}
	s = newBatchSetup(t, sim.BatchConfig{MaxBytes: 300}, BatchLimits{}, "")
	for kind, c := range s.client {
		_, err := c.Submit(ctx, BatchRequest{Model: batchModelOf(kind), Lines: batchLines(batchModelOf(kind), 4)})
		var he *BatchHTTPError
		if !errors.Is(err, ErrBatchTooLarge) || !errors.As(err, &he) || he.Outcome.Class != Fail {
			t.Errorf("%s, over the provider's 300 bytes: got %v, want ErrBatchTooLarge, an invalid-request answer", kind, err)
		}
	}
}

// A batch submitted with a key is found by it (OpenAI's and Azure's
// metadata), and a key no batch carries is not: a create whose answer was
// lost is settled without a second submission.
func TestBatchFindByKey(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"openai", "azure"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := newBatchSetup(t, sim.BatchConfig{Duration: 10 * time.Second}, BatchLimits{}, sim.ProfileAzure)
			c, ctx, model := s.client[kind], ctxT(t), batchModelOf(kind)
			f, ok := c.(BatchFinder)
			if !ok {
				t.Fatal("no BatchFinder")
			}
			if _, err := c.Submit(ctx, BatchRequest{Model: model, Lines: batchLines(model, 2), Key: "other"}); err != nil {
				t.Fatal(err)
			}
			b, err := c.Submit(ctx, BatchRequest{Model: model, Lines: batchLines(model, 3), Key: "k1"})
			if err != nil {
				t.Fatal(err)
			}
			got, found, err := f.Find(ctx, "k1")
			if err != nil || !found || got.ID != b.ID {
				t.Errorf("Find(k1) = %+v, %v, %v; want batch %s", got, found, err, b.ID)
			}
			if _, found, err := f.Find(ctx, "k2"); err != nil || found {
				t.Errorf("Find(k2) = %v, %v; want not found", found, err)
			}
		})
	}
	if _, ok := newBatchSetup(t, sim.BatchConfig{}, BatchLimits{}, sim.ProfileAzure).client["anthropic"].(BatchFinder); ok {
		t.Error("Anthropic's client finds batches by key, but its batches carry no metadata")
	}
}
