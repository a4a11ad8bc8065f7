package systest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// batchLine is one request line of a batch's input file.
func batchLine(customID, url, model, prompt string) string {
	return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":%q,"body":{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":%q}]}}`,
		customID, url, model, prompt)
}

// batchInput is n chat lines, custom ids req-00 on.
func batchInput(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		b.WriteString(batchLine(fmt.Sprintf("req-%02d", i), "/v1/chat/completions", "gpt-4o-mini", fmt.Sprintf("say hello %d", i)) + "\n")
	}
	return b.Bytes()
}

// outputLine is a line of a batch's output or error file.
type outputLine struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// fileLines downloads a file with the SDK and decodes its lines ("" id:
// none).
func fileLines(t *testing.T, ctx context.Context, c openai.Client, id string) []outputLine {
	t.Helper()
	if id == "" {
		return nil
	}
	resp, err := c.Files.Content(ctx, id)
	if err != nil {
		t.Fatalf("file %s content: %v", id, err)
	}
	defer resp.Body.Close()
	var out []outputLine
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l outputLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("file %s: line %q: %v", id, sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

// uploadAndCreate uploads input as acme's batch file and creates its batch.
func uploadAndCreate(t *testing.T, ctx context.Context, c openai.Client, input []byte) (*openai.FileObject, *openai.Batch) {
	t.Helper()
	f, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(input), "input.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	if f.Bytes != int64(len(input)) || f.Purpose != openai.FileObjectPurposeBatch {
		t.Fatalf("uploaded file: got %d bytes, purpose %q; want %d, batch", f.Bytes, f.Purpose, len(input))
	}
	b, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h, Metadata: map[string]string{"run": "test"}})
	if err != nil {
		t.Fatalf("create batch: %v", err)
	}
	return f, b
}

// waitBatch polls the batch until it is in one of the states.
func waitBatch(t *testing.T, ctx context.Context, c openai.Client, id string, states ...openai.BatchStatus) *openai.Batch {
	t.Helper()
	var last *openai.Batch
	natstest.Eventually(t, 90*time.Second, func() error {
		b, err := c.Batches.Get(ctx, id)
		if err != nil {
			return err
		}
		last = b
		for _, s := range states {
			if b.Status == s {
				return nil
			}
		}
		return fmt.Errorf("batch %s: %s (%d/%d done), want %v", id, b.Status, b.RequestCounts.Completed+b.RequestCounts.Failed, b.RequestCounts.Total, states)
	})
	return last
}

func sdkAs(n Node, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(n.HTTP+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// is404 reports whether err is the SDK's error for a 404.
func is404(err error) bool {
	var ae *openai.Error
	return errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound
}

// TestBatchThroughOpenAISDK: the OpenAI SDK's batch workflow against
// Sluice (upload, create, poll, download) answers every line once with the
// simulator's reply, one provider call per line; another tenant gets 404
// for the file, its content, the batch and its output.
func TestBatchThroughOpenAISDK(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 10000, TPM: 10_000_000}}, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 10000, 10_000_000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := SDK(n)
	const lines = 20
	f, b := uploadAndCreate(t, ctx, c, batchInput(lines))
	if b.Status != openai.BatchStatusValidating || b.RequestCounts.Total != lines {
		t.Fatalf("created: status %s, total %d; want validating, %d", b.Status, b.RequestCounts.Total, lines)
	}
	done := waitBatch(t, ctx, c, b.ID, openai.BatchStatusCompleted, openai.BatchStatusFailed, openai.BatchStatusExpired, openai.BatchStatusCancelled)
	if done.Status != openai.BatchStatusCompleted || done.RequestCounts.Completed != lines || done.RequestCounts.Failed != 0 || done.CompletedAt == 0 || done.InProgressAt == 0 {
		t.Fatalf("ended: %s, counts %+v; want completed with %d completed", done.Status, done.RequestCounts, lines)
	}
	if done.ErrorFileID != "" {
		t.Errorf("error file %q, want none", done.ErrorFileID)
	}
	out := fileLines(t, ctx, c, done.OutputFileID)
	seen := map[string]int{}
	for _, l := range out {
		seen[l.CustomID]++
		if l.Response == nil || l.Response.StatusCode != http.StatusOK || l.Error != nil {
			t.Errorf("line %s: response %+v, error %+v; want 200", l.CustomID, l.Response, l.Error)
			continue
		}
		var cc openai.ChatCompletion
		if err := json.Unmarshal(l.Response.Body, &cc); err != nil || len(cc.Choices) == 0 || cc.Choices[0].Message.Content == "" || cc.Model == "" {
			t.Errorf("line %s: body %s is not the simulator's chat completion (%v)", l.CustomID, l.Response.Body, err)
		}
	}
	for i := range lines {
		if id := fmt.Sprintf("req-%02d", i); seen[id] != 1 {
			t.Errorf("custom_id %s answered %d times, want once", id, seen[id])
		}
	}
	if got := totalRequests(simSrv.Stats()); got != lines {
		t.Errorf("simulator answered %d requests, want %d (one per line)", got, lines)
	}
	other := sdkAs(n, Env["GLOBEX_KEY"])
	if _, err := other.Files.Get(ctx, f.ID); !is404(err) {
		t.Errorf("globex reads acme's file: %v, want 404", err)
	}
	for _, id := range []string{f.ID, done.OutputFileID} {
		if resp, err := other.Files.Content(ctx, id); !is404(err) {
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Errorf("globex reads acme's file %s's content: %d bytes", id, len(body))
			} else {
				t.Errorf("globex reads acme's file %s's content: %v, want 404", id, err)
			}
		}
	}
	if _, err := other.Batches.Get(ctx, b.ID); !is404(err) {
		t.Errorf("globex reads acme's batch: %v, want 404", err)
	}
	if _, err := other.Batches.Cancel(ctx, b.ID); !is404(err) {
		t.Errorf("globex cancels acme's batch: %v, want 404", err)
	}
	if _, err := other.Files.Delete(ctx, f.ID); !is404(err) {
		t.Errorf("globex deletes acme's file: %v, want 404", err)
	}
	listed := func(c openai.Client) bool {
		page, err := c.Batches.List(ctx, openai.BatchListParams{})
		if err != nil {
			t.Fatalf("list batches: %v", err)
		}
		for _, it := range page.Data {
			if it.ID == b.ID {
				return true
			}
		}
		return false
	}
	if !listed(c) || listed(other) {
		t.Errorf("batch listed for acme %v, for globex %v; want acme's only", listed(c), listed(other))
	}
	if del, err := c.Files.Delete(ctx, f.ID); err != nil || !del.Deleted {
		t.Errorf("delete the input file: %+v, %v", del, err)
	}
	if _, err := c.Files.Get(ctx, f.ID); !is404(err) {
		t.Errorf("a deleted file: %v, want 404", err)
	}
}

// TestBatchCancelKeepsCompleted: a batch cancelled while its jobs wait
// for a slow model ends cancelled; the lines that completed are in its
// output file, the others in its error file as batch_cancelled, and the
// provider saw only the completed ones.
func TestBatchCancelKeepsCompleted(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 30, TPM: 1_000_000}}, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 30, 1_000_000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := SDK(n)
	const lines = 20
	f, b := uploadAndCreate(t, ctx, c, batchInput(lines))
	var ae *openai.Error
	if _, err := c.Files.Delete(ctx, f.ID); !errors.As(err, &ae) || ae.StatusCode != http.StatusConflict || ae.Code != "file_in_use" {
		t.Errorf("delete the input of a batch in progress: %v, want 409 file_in_use", err)
	}
	natstest.Eventually(t, 60*time.Second, func() error {
		got, err := c.Batches.Get(ctx, b.ID)
		if err != nil {
			return err
		}
		if got.RequestCounts.Completed < 1 {
			return fmt.Errorf("batch %s: %s, %d completed", b.ID, got.Status, got.RequestCounts.Completed)
		}
		return nil
	})
	cb, err := c.Batches.Cancel(ctx, b.ID)
	if err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if cb.Status != openai.BatchStatusCancelling && cb.Status != openai.BatchStatusCancelled {
		t.Fatalf("cancel answered %s, want cancelling", cb.Status)
	}
	done := waitBatch(t, ctx, c, b.ID, openai.BatchStatusCancelled, openai.BatchStatusCompleted)
	if done.Status != openai.BatchStatusCancelled || done.CancelledAt == 0 {
		t.Fatalf("ended %s, want cancelled", done.Status)
	}
	completed := int(done.RequestCounts.Completed)
	t.Logf("cancelled with %d of %d lines completed", completed, lines)
	if completed < 1 || completed >= lines || done.RequestCounts.Failed != int64(lines-completed) {
		t.Fatalf("counts %+v: want some but not all %d completed, the rest failed", done.RequestCounts, lines)
	}
	out, errs := fileLines(t, ctx, c, done.OutputFileID), fileLines(t, ctx, c, done.ErrorFileID)
	if len(out) != completed || len(errs) != lines-completed {
		t.Fatalf("output %d lines, error %d; want %d and %d", len(out), len(errs), completed, lines-completed)
	}
	seen := map[string]bool{}
	for _, l := range out {
		seen[l.CustomID] = true
		if l.Response == nil || l.Response.StatusCode != http.StatusOK {
			t.Errorf("output line %s: %+v, want 200", l.CustomID, l.Response)
		}
	}
	for _, l := range errs {
		if seen[l.CustomID] {
			t.Errorf("custom_id %s in both files", l.CustomID)
		}
		seen[l.CustomID] = true
		if l.Error == nil || l.Error.Code != "batch_cancelled" {
			t.Errorf("error line %s: %+v, want batch_cancelled", l.CustomID, l.Error)
		}
	}
	if len(seen) != lines {
		t.Errorf("%d custom ids answered, want %d", len(seen), lines)
	}
	Quiet(t, n, 30*time.Second)
	if got := totalRequests(simSrv.Stats()); got != int64(completed) {
		t.Errorf("simulator answered %d requests, want %d (the completed lines only)", got, completed)
	}
}

// TestBatchValidationErrors: a batch whose input has problems fails at
// once, each problem with its line and OpenAI's code; more than 50,000
// lines is too_many_tasks; a file over batches.max_file_bytes is refused
// at upload (413), and past batches.max_files_per_tenant (400).
func TestBatchValidationErrors(t *testing.T) {
	t.Parallel()
	_, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 10000, TPM: 10_000_000}}, APIKeys: []string{"sim-secret"}})
	n := StartLogged(t, SimConfig(simURL, "gpt-4o-mini", 10000, 10_000_000, "batches: {max_file_bytes: 8388608, max_files_per_tenant: 2}\n"), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := SDK(n)
	const chat = "/v1/chat/completions"
	upload := func(data []byte) error {
		_, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(data), "in.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
		return err
	}
	big := bytes.Repeat([]byte(batchLine("z", chat, "gpt-4o-mini", strings.Repeat("y", 1000))+"\n"), 8<<10)
	var ae *openai.Error
	if err := upload(big); !errors.As(err, &ae) || ae.StatusCode != http.StatusRequestEntityTooLarge || ae.Code != "file_too_large" {
		t.Errorf("a file over the bound: %v, want 413 file_too_large", err)
	}
	input := strings.Join([]string{
		batchLine("a", chat, "gpt-4o-mini", "fine"),
		`{"custom_id": "b", "method": "POST", "url": ` + "\n",
		batchLine("a", chat, "gpt-4o-mini", "again"),
		batchLine("c", "/v1/embeddings", "gpt-4o-mini", "wrong url"),
		batchLine("d", chat, "no-such-model", "unknown model"),
	}, "\n") + "\n"
	_, b := uploadAndCreate(t, ctx, c, []byte(input))
	if b.Status != openai.BatchStatusFailed || b.FailedAt == 0 {
		t.Fatalf("status %s, want failed", b.Status)
	}
	want := []struct {
		code string
		line int64
	}{{"invalid_json_line", 2}, {"duplicate_custom_id", 4}, {"url_mismatch", 5}, {"unknown_model", 6}}
	if len(b.Errors.Data) != len(want) {
		t.Fatalf("errors %+v, want %d", b.Errors.Data, len(want))
	}
	for i, w := range want {
		if got := b.Errors.Data[i]; got.Code != w.code || got.Line != w.line {
			t.Errorf("error %d: got %s at line %d, want %s at line %d", i, got.Code, got.Line, w.code, w.line)
		}
	}
	var many bytes.Buffer
	for i := range 50_001 {
		many.WriteString(batchLine(fmt.Sprint(i), chat, "gpt-4o-mini", "x") + "\n")
	}
	_, b = uploadAndCreate(t, ctx, c, many.Bytes())
	if b.Status != openai.BatchStatusFailed || len(b.Errors.Data) == 0 || b.Errors.Data[0].Code != "too_many_tasks" {
		t.Fatalf("50,001 lines: status %s, errors %+v; want failed, too_many_tasks", b.Status, b.Errors.Data)
	}
	// Two files stored (the one over the bound was not): the bound of 2.
	if err := upload([]byte(input)); !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Code != "file_limit_exceeded" {
		t.Errorf("a third file: %v, want 400 file_limit_exceeded", err)
	}
}

// TestBatchOnIngestOnlyProcess: a process running ingest alone (its own
// NATS identity and permissions) serves the Batch API, runs the batches
// and cancels their jobs; the other services run in another process.
func TestBatchOnIngestOnlyProcess(t *testing.T) {
	t.Parallel()
	_, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 30, TPM: 1_000_000}}, APIKeys: []string{"sim-secret"}})
	cfg := SimConfig(simURL, "gpt-4o-mini", 30, 1_000_000, "")
	rest := StartWith(t, cfg, Setup{Env: Env, Services: []string{"admission", "executor", "result"}})
	n := StartWith(t, cfg, Setup{Env: Env, NATSURL: rest.NATS, Data: rest.Data, Services: []string{"ingest"}})
	WaitReady(t, n.HTTP)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := SDK(n)
	_, b := uploadAndCreate(t, ctx, c, batchInput(3))
	done := waitBatch(t, ctx, c, b.ID, openai.BatchStatusCompleted, openai.BatchStatusFailed, openai.BatchStatusExpired, openai.BatchStatusCancelled)
	if done.Status != openai.BatchStatusCompleted || len(fileLines(t, ctx, c, done.OutputFileID)) != 3 {
		t.Fatalf("first batch: %s, counts %+v; want completed, 3 lines", done.Status, done.RequestCounts)
	}
	_, b = uploadAndCreate(t, ctx, c, batchInput(20))
	if _, err := c.Batches.Cancel(ctx, b.ID); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	done = waitBatch(t, ctx, c, b.ID, openai.BatchStatusCancelled, openai.BatchStatusCompleted)
	if done.Status != openai.BatchStatusCancelled || done.RequestCounts.Completed+done.RequestCounts.Failed != 20 || done.RequestCounts.Failed == 0 {
		t.Fatalf("second batch: %s, counts %+v; want cancelled, some lines batch_cancelled", done.Status, done.RequestCounts)
	}
}
