package mesh_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/pkg/job"
)

// A terminal record written with the result as it came reads as the
// record encoded whole would.
func TestTerminalRecord(t *testing.T) {
	t.Parallel()
	cost := 0.25
	for _, r := range []*job.Result{
		{JobID: "j1", Tenant: "acme", Status: job.StatusSucceeded, Response: json.RawMessage(`{"id":"c","choices":[{"message":{"content":"hi \u2028 there"}}]}`),
			Usage: &job.Usage{PromptTokens: 3, CompletionTokens: 2, TotalTokens: 5}, Attempts: 1, Provider: "openai", Model: "m",
			SubmittedAt: time.Date(2026, 12, 3, 11, 0, 0, 123, time.UTC), CompletedAt: time.Date(2026, 12, 3, 11, 0, 1, 0, time.UTC), Cost: &cost},
		{JobID: "j2", Tenant: "t-2", Status: job.StatusFailed, Error: &job.Error{Code: "x", Message: "no \"quote\""}},
	} {
		raw, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var got, want mesh.Record
		if err := json.Unmarshal(mesh.TerminalRecord(r, raw), &got); err != nil {
			t.Fatalf("%s: terminal record does not decode: %v", r.JobID, err)
		}
		whole, _ := json.Marshal(&mesh.Record{JobID: r.JobID, Tenant: r.Tenant, Status: r.Status, SubmittedAt: r.SubmittedAt, Result: r})
		if err := json.Unmarshal(whole, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %+v, want %+v", r.JobID, got, want)
		}
	}
}

// BenchmarkTerminalRecord is the result service's record write: the
// record encoded whole against the result spliced in as it came.
func BenchmarkTerminalRecord(b *testing.B) {
	r := &job.Result{JobID: "0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e", Tenant: "acme", Status: job.StatusSucceeded,
		Response: json.RawMessage(`{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello, benchmark."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":4,"total_tokens":16}}`),
		Usage:    &job.Usage{PromptTokens: 12, CompletionTokens: 4, TotalTokens: 16}, Attempts: 1, Provider: "openai", Model: "gpt-4o-mini",
		SubmittedAt: time.Now(), CompletedAt: time.Now()}
	raw, _ := json.Marshal(r)
	b.Run("whole", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(&mesh.Record{JobID: r.JobID, Tenant: r.Tenant, Status: r.Status, SubmittedAt: r.SubmittedAt, Result: r})
		}
	})
	b.Run("spliced", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = mesh.TerminalRecord(r, raw)
		}
	})
}
