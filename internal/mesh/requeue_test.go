package mesh_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Each reason a job goes to QUEUE has its own message-id kind (as the
// executor's returns and retries had), the seq telling sends apart.
func TestRequeueTable(t *testing.T) {
	t.Parallel()
	j := &task.Task{Job: job.Job{ID: "0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e", Tenant: "acme"}}
	for why, want := range map[mesh.Reason]string{
		mesh.Accepted:       keys.MsgID(keys.MsgQueued, "acme", j.ID, ""),
		mesh.Retried:        keys.MsgID(keys.MsgRetry, "acme", j.ID, "2"),
		mesh.RateLimited:    keys.MsgID(keys.MsgRateLimited, "acme", j.ID, "2"),
		mesh.Unverified:     keys.MsgID(keys.MsgUnverified, "acme", j.ID, "2"),
		mesh.Lapsed:         keys.MsgID(keys.MsgReadmit, "acme", j.ID, "2"),
		mesh.TenantSlot:     keys.MsgID(keys.MsgTenantSlot, "acme", j.ID, "2"),
		mesh.BreakerOpen:    keys.MsgID(keys.MsgBreaker, "acme", j.ID, "2"),
		mesh.DeploymentDown: keys.MsgID(keys.MsgDown, "acme", j.ID, "2"),
		mesh.Drained:        keys.MsgID(keys.MsgDrain, "acme", j.ID, "2"),
		mesh.Fallback:       keys.MsgID(keys.MsgFallback, "acme", j.ID, "2"),
	} {
		seq := "2"
		if why == mesh.Accepted {
			seq = ""
		}
		if got, ok := mesh.QueueMsgID(j, why, seq); !ok || got != want {
			t.Errorf("QueueMsgID(%s) = %q, %v; want %q", why, got, ok, want)
		}
	}
	seen := map[string]mesh.Reason{}
	for _, why := range []mesh.Reason{mesh.Accepted, mesh.Retried, mesh.RateLimited, mesh.Unverified, mesh.Lapsed, mesh.TenantSlot,
		mesh.BreakerOpen, mesh.DeploymentDown, mesh.Drained, mesh.Fallback} {
		id, _ := mesh.QueueMsgID(j, why, "1")
		if other, dup := seen[id]; dup {
			t.Errorf("%s and %s share message id %q", why, other, id)
		}
		seen[id] = why
	}
	if id, ok := mesh.QueueMsgID(j, "no-such-reason", "1"); ok {
		t.Errorf("an unknown reason has message id %q", id)
	}
}

// Requeue puts the job in QUEUE under its priority and tenant; a repeat
// of one send is dropped, a send with another seq is not, and an unknown
// reason is an error, nothing sent.
func TestRequeue(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{})
	j := &task.Task{Job: job.Job{ID: job.NewID(), Tenant: "acme", Priority: job.Batch}, Model: "m"}
	for _, seq := range []string{"1", "1", "2"} {
		if err := m.Requeue(ctx, j, mesh.Retried, seq); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Requeue(ctx, j, "no-such-reason", "3"); err == nil {
		t.Error("an unknown reason: no error")
	}
	st, err := m.JS.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(job.QueueSubject(job.Batch, "acme")))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[job.QueueSubject(job.Batch, "acme")]; n != 2 {
		t.Errorf("QUEUE holds %d sends, want 2 (the repeat dropped)", n)
	}
	msg, err := st.GetLastMsgForSubject(ctx, job.QueueSubject(job.Batch, "acme"))
	if err != nil {
		t.Fatal(err)
	}
	var got task.Task
	if err := json.Unmarshal(msg.Data, &got); err != nil || got.ID != j.ID || got.Model != "m" {
		t.Errorf("QUEUE holds %s, want job %s", msg.Data, j.ID)
	}
	if id := msg.Header.Get(jetstream.MsgIDHeader); id != keys.MsgID(keys.MsgRetry, "acme", j.ID, "2") {
		t.Errorf("message id %q, want the retry's", id)
	}
}
