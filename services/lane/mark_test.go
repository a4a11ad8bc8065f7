package lane

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// A job's sent mark is refused when its caller's cancel marked its
// operation record first, even before the result service marks the
// record ended: the job is not submitted. An operation not cancelled is
// marked as in the batch.
func TestMarkRefusesCancelled(t *testing.T) {
	t.Parallel()
	m := meshtest.New(t, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	c := &submitter{env: &env{Service: &Service{m: m, now: func() time.Time { return now }}, provider: "p", model: "m"}}
	o := &open{rec: &record{ID: "b1"}}
	for _, cancelled := range []bool{true, false} {
		id := job.NewID()
		opKey, _ := mesh.OpKey("acme", "", id)
		data, _ := json.Marshal(mesh.OpRecord{JobID: id, State: mesh.OpQueued, Cancelled: cancelled})
		if _, err := m.Idempotency.Create(ctx, opKey, data); err != nil {
			t.Fatal(err)
		}
		h := &held{j: &task.Task{Job: job.Job{ID: id, Tenant: "acme"}}, opKey: opKey}
		err := c.mark(ctx, o, h, now)
		op, _, gerr := m.GetOp(ctx, opKey)
		if gerr != nil {
			t.Fatal(gerr)
		}
		switch {
		case cancelled && (!errors.Is(err, errCancelled) || op.Sent != nil):
			t.Errorf("cancelled operation: mark = %v, sent mark %+v; want errCancelled and no mark", err, op.Sent)
		case !cancelled && (err != nil || op.Sent == nil || op.Sent.By != markPrefix+"b1"):
			t.Errorf("operation: mark = %v, sent mark %+v; want it marked in batch b1", err, op.Sent)
		}
	}
}
