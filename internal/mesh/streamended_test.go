package mesh_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// TestStreamEnded: a job's stream counts as ended only once its last
// message carries the end marker.
func TestStreamEnded(t *testing.T) {
	t.Parallel()
	m := meshtest.New(t, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, other := job.NewID(), job.NewID()
	publish := func(sm job.StreamMessage) {
		t.Helper()
		data, _ := json.Marshal(sm)
		if _, err := m.JS.Publish(ctx, job.StreamSubject("acme", id), data); err != nil {
			t.Fatal(err)
		}
	}
	if m.StreamEnded(ctx, "acme", id) {
		t.Fatal("ended with nothing streamed")
	}
	publish(job.StreamMessage{Chunks: []json.RawMessage{json.RawMessage(`{"choices":[]}`)}})
	if m.StreamEnded(ctx, "acme", id) {
		t.Fatal("ended after a chunk without the end marker")
	}
	publish(job.StreamMessage{End: job.StatusInterrupted})
	if !m.StreamEnded(ctx, "acme", id) {
		t.Fatal("not ended after the end marker")
	}
	if m.StreamEnded(ctx, "acme", other) || m.StreamEnded(ctx, "acme", "bad id*") {
		t.Fatal("another job's stream (or no valid job) ended")
	}
}
