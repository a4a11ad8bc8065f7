package dlq_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/pkg/job"
)

// A Responses job carrying the native member (set by the /v1/responses
// handler only; ingest refuses it from INTAKE) is not replayed, and its
// dead letter stays.
func TestReplayNativeResponsesKeepsTheDeadLetter(t *testing.T) {
	t.Parallel()
	f := setup(t)
	e := entry("acme")
	e.Job.Endpoint = job.EndpointResponses
	e.Job.Request = json.RawMessage(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"sluice_responses":{"input":[],"tools":[{"type":"web_search"}]}}`)
	f.publish(t, e)
	rep, err := dlq.Replay(f.ctx, f.js, []string{e.Job.ID}, "", nil)
	if err == nil || len(rep.Replayed) != 0 || !strings.Contains(err.Error(), "/v1/responses") {
		t.Fatalf("replay of a native Responses job: %+v, %v; want none replayed, an error naming /v1/responses", rep, err)
	}
	if _, err := dlq.Get(f.ctx, f.js, "acme", e.Job.ID); err != nil {
		t.Errorf("its dead letter after the refused replay: %v, want it kept", err)
	}
}
