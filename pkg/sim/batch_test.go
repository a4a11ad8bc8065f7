package sim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/pkg/sim"
)

func batchCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// jsonl is n OpenAI batch lines for model, c0..c(n-1).
func jsonl(model string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"c%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"max_tokens":20,"messages":[{"role":"user","content":"q%d"}]}}`+"\n", i, model, i)
	}
	return b.String()
}

// TestOpenAIBatchSDK: the official OpenAI SDK's batch workflow against the
// simulator: upload, create, follow, read the output file; cancel another
// batch midway and find its answered lines in its output file and the rest
// as batch_cancelled in its error file.
func TestOpenAIBatchSDK(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 60, TPM: 1000}}, Now: clk.Now, Batch: sim.BatchConfig{Duration: 4 * time.Second}})
	c := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	ctx := batchCtx(t)
	submit := func(n int) *openai.Batch {
		f, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader(jsonl("gpt-4o-mini", n)), "in.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
		if err != nil {
			t.Fatal(err)
		}
		if b.Status != openai.BatchStatusValidating || b.InputFileID != f.ID {
			t.Fatalf("created: status %s, input %s; want validating, %s", b.Status, b.InputFileID, f.ID)
		}
		return b
	}
	content := func(id string) string {
		resp, err := c.Files.Content(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	done, cut := submit(4), submit(4)
	clk.Advance(2500 * time.Millisecond) // two lines of each done, the third in progress
	if b, err := c.Batches.Get(ctx, done.ID); err != nil || b.Status != openai.BatchStatusInProgress || b.RequestCounts.Completed != 2 || b.RequestCounts.Total != 4 {
		t.Fatalf("midway: %+v, %v; want in_progress, 2 of 4 completed", b.RequestCounts, err)
	}
	if b, err := c.Batches.Cancel(ctx, cut.ID); err != nil || b.Status != openai.BatchStatusCancelling {
		t.Fatalf("cancel: %v, %v; want cancelling", b.Status, err)
	}
	clk.Advance(1500 * time.Millisecond) // both: the last line (or the one in progress) finishes
	b, err := c.Batches.Get(ctx, done.ID)
	if err != nil || b.Status != openai.BatchStatusFinalizing {
		t.Fatalf("after the last line: %v, %v; want finalizing", b.Status, err)
	}
	clk.Advance(time.Second)
	if b, err = c.Batches.Get(ctx, done.ID); err != nil || b.Status != openai.BatchStatusCompleted || b.OutputFileID == "" || b.ErrorFileID != "" {
		t.Fatalf("done: %v, output %q, error %q, %v; want completed with an output file only", b.Status, b.OutputFileID, b.ErrorFileID, err)
	}
	if out := content(b.OutputFileID); strings.Count(out, `"status_code":200`) != 4 || !strings.Contains(out, `"custom_id":"c3"`) {
		t.Errorf("output file: %s", out)
	}
	if b, err = c.Batches.Get(ctx, cut.ID); err != nil || b.Status != openai.BatchStatusCancelled || b.RequestCounts.Completed != 3 {
		t.Fatalf("cancelled: %v, %+v, %v; want cancelled with 3 completed", b.Status, b.RequestCounts, err)
	}
	if out, errs := content(b.OutputFileID), content(b.ErrorFileID); strings.Count(out, "\n") != 3 || !strings.Contains(errs, `"custom_id":"c3"`) || !strings.Contains(errs, `"code":"batch_cancelled"`) {
		t.Errorf("cancelled batch: output %s\nerrors %s", out, errs)
	}
	if st := s.Stats(); st.Completed != 0 || st.Models["gpt-4o-mini"].MaxRequestsIn60s != 0 {
		t.Errorf("batch lines counted as synchronous calls: %d completed, %d requests in 60 s", st.Completed, st.Models["gpt-4o-mini"].MaxRequestsIn60s)
	}
}

// TestMessageBatchSDK: the official Anthropic SDK's batch workflow against
// the simulator: create, follow (every request processing until the
// batch ends), stream the results, errored requests in Anthropic's shape.
func TestMessageBatchSDK(t *testing.T) {
	t.Parallel()
	clk := newClock()
	const model = "claude-3-5-haiku-latest"
	_, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 50, ITPM: 1000, OTPM: 1000}}, Now: clk.Now, Batch: sim.BatchConfig{Duration: 2 * time.Second}})
	c := anthropic.NewClient(aoption.WithBaseURL(url+"/"), aoption.WithAPIKey("k"), aoption.WithMaxRetries(0))
	ctx := batchCtx(t)
	req := func(id string, maxTokens int64) anthropic.MessageBatchNewParamsRequest {
		return anthropic.MessageBatchNewParamsRequest{CustomID: id, Params: anthropic.MessageBatchNewParamsRequestParams{
			Model: model, MaxTokens: maxTokens, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))}}}
	}
	b, err := c.Messages.Batches.New(ctx, anthropic.MessageBatchNewParams{Requests: []anthropic.MessageBatchNewParamsRequest{req("ok-1", 30), req("ok-2", 30), req("bad", 0)}})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if b, err = c.Messages.Batches.Get(ctx, b.ID, anthropic.MessageBatchGetParams{}); err != nil || b.ProcessingStatus != anthropic.MessageBatchProcessingStatusInProgress || b.RequestCounts.Processing != 3 || b.ResultsURL != "" {
		t.Fatalf("midway: %v %+v %q, %v; want in_progress, 3 processing, no results_url", b.ProcessingStatus, b.RequestCounts, b.ResultsURL, err)
	}
	clk.Advance(time.Second)
	if b, err = c.Messages.Batches.Get(ctx, b.ID, anthropic.MessageBatchGetParams{}); err != nil || b.ProcessingStatus != anthropic.MessageBatchProcessingStatusEnded ||
		b.RequestCounts.Succeeded != 2 || b.RequestCounts.Errored != 1 || !strings.HasSuffix(b.ResultsURL, "/v1/messages/batches/"+b.ID+"/results") {
		t.Fatalf("ended: %v %+v %q, %v; want ended, 2 succeeded, 1 errored, a results_url", b.ProcessingStatus, b.RequestCounts, b.ResultsURL, err)
	}
	stream := c.Messages.Batches.ResultsStreaming(ctx, b.ID, anthropic.MessageBatchResultsParams{})
	got := map[string]string{}
	for stream.Next() {
		r := stream.Current()
		got[r.CustomID] = r.Result.Type
		switch r.Result.Type {
		case "succeeded":
			if m := r.Result.AsSucceeded().Message; m.Usage.OutputTokens == 0 || len(m.Content) == 0 {
				t.Errorf("%s: message %+v", r.CustomID, m)
			}
		case "errored":
			if e := r.Result.AsErrored().Error.Error; e.Type != "invalid_request_error" {
				t.Errorf("%s: error %+v, want invalid_request_error", r.CustomID, e)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"ok-1": "succeeded", "ok-2": "succeeded", "bad": "errored"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("results: got %v, want %v", got, want)
	}
	r := do(t, http.MethodGet, url+"/stats/batches", "")
	var ledger struct {
		Lines []sim.BatchLine `json:"lines"`
	}
	if err := json.Unmarshal(r.body, &ledger); err != nil || len(ledger.Lines) != 3 {
		t.Fatalf("GET /stats/batches: %s, %v; want 3 lines", r.body, err)
	}
	for _, l := range ledger.Lines {
		if paid := l.InputTokens+l.OutputTokens > 0; paid != (l.Result == "succeeded") || l.API != "anthropic" || l.Model != model {
			t.Errorf("ledger line %+v: billed only when succeeded, for %s", l, model)
		}
	}
}

// TestOpenAIBatchValidation: an input file OpenAI would refuse fails the
// batch, with the code and line OpenAI reports; nothing of it runs.
func TestOpenAIBatchValidation(t *testing.T) {
	t.Parallel()
	line := func(id, url, model string) string {
		return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":%q,"body":{"model":%q,"messages":[{"role":"user","content":"q"}]}}`, id, url, model)
	}
	const chatURL, m = "/v1/chat/completions", "gpt-4o-mini"
	for _, tc := range []struct {
		name, file, code string
		line             int
	}{
		{"empty", "\n", "empty_file", 0},
		{"not json", line("a", chatURL, m) + "\n{oops\n", "invalid_json_line", 2},
		{"duplicate id", line("a", chatURL, m) + "\n" + line("a", chatURL, m) + "\n", "duplicate_custom_id", 2},
		{"other url", line("a", chatURL, m) + "\n" + line("b", "/v1/embeddings", m) + "\n", "url_mismatch", 2},
		{"two models", line("a", chatURL, m) + "\n" + line("b", chatURL, "gpt-4o") + "\n", "model_mismatch", 2},
		{"too many", jsonl(m, 4), "too_many_tasks", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: m}, {Name: "gpt-4o"}}, Batch: sim.BatchConfig{MaxRequests: 3}})
			c := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
			ctx := batchCtx(t)
			f, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader(tc.file), "in.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
			if err != nil {
				t.Fatal(err)
			}
			b, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
			if err != nil {
				t.Fatal(err)
			}
			if b, err = c.Batches.Get(ctx, b.ID); err != nil || b.Status != openai.BatchStatusFailed || len(b.Errors.Data) != 1 {
				t.Fatalf("got %v %+v, %v; want failed with one error", b.Status, b.Errors, err)
			}
			if e := b.Errors.Data[0]; e.Code != tc.code || int(e.Line) != tc.line {
				t.Errorf("got code %s line %d, want %s line %d", e.Code, e.Line, tc.code, tc.line)
			}
			if n := len(s.BatchLines()); n != 0 {
				t.Errorf("%d lines of a failed batch ran", n)
			}
		})
	}
}

// TestBatchRefusals: requests both Batch APIs refuse at once, as the
// providers do.
func TestBatchRefusals(t *testing.T) {
	t.Parallel()
	_, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini"}}, APIKeys: []string{"k"}, Batch: sim.BatchConfig{MaxRequests: 2}})
	an := []string{"X-Api-Key", "k", "Anthropic-Version", "2023-06-01"}
	req := func(id string) string {
		return fmt.Sprintf(`{"custom_id":%q,"params":{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"q"}]}}`, id)
	}
	for _, tc := range []struct {
		name, method, path, body string
		hdr                      []string
		status                   int
		want                     string
	}{
		{"openai without a key", http.MethodGet, "/v1/batches/batch_x", "", nil, 401, "invalid_api_key"},
		{"unknown batch", http.MethodGet, "/v1/batches/batch_x", "", []string{"Authorization", "Bearer k"}, 404, "No batch found"},
		{"unknown file", http.MethodPost, "/v1/batches", `{"input_file_id":"file-x","endpoint":"/v1/chat/completions","completion_window":"24h"}`, []string{"Authorization", "Bearer k"}, 400, "input_file_id"},
		{"window", http.MethodPost, "/v1/batches", `{"input_file_id":"file-x","endpoint":"/v1/chat/completions","completion_window":"1h"}`, []string{"Authorization", "Bearer k"}, 400, "completion_window"},
		{"anthropic without version", http.MethodPost, "/v1/messages/batches", `{"requests":[` + req("a") + `]}`, []string{"X-Api-Key", "k"}, 400, "anthropic-version"},
		{"duplicate custom_id", http.MethodPost, "/v1/messages/batches", `{"requests":[` + req("a") + "," + req("a") + `]}`, an, 400, "custom_id"},
		{"malformed custom_id", http.MethodPost, "/v1/messages/batches", `{"requests":[` + req("a b") + `]}`, an, 400, "custom_id"},
		{"too many requests", http.MethodPost, "/v1/messages/batches", `{"requests":[` + req("a") + "," + req("b") + "," + req("c") + `]}`, an, 400, "1 to 2 requests"},
		{"unknown message batch", http.MethodGet, "/v1/messages/batches/msgbatch_x/results", "", an, 404, "not_found_error"},
	} {
		r := do(t, tc.method, url+tc.path, tc.body, tc.hdr...)
		if r.status != tc.status || !strings.Contains(string(r.body), tc.want) {
			t.Errorf("%s: got %d %s, want %d with %q", tc.name, r.status, r.body, tc.status, tc.want)
		}
	}
}
