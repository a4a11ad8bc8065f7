package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// run starts the service's consumers for the test.
func (f *fixture) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// A flood of invalid jobs over NATS stores nothing: each refusal reaches a
// producer listening on the result subject, and neither RESULTS nor the
// results bucket keeps it (the jobs never had a record).
func TestInvalidJobFloodStoresNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub, err := f.nc.SubscribeSync(job.ResultPrefix + "acme.>")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	const n = 300
	for i := range n {
		data, _ := json.Marshal(&task.Task{
			Job: job.Job{ID: job.NewID(), Tenant: "acme", Request: json.RawMessage(`{"model":"fast","max_tokens":-1,"messages":[{"role":"user","content":"` + strings.Repeat("x", i) + `"}]}`)},
		})
		if _, err := f.js.PublishAsync(job.IntakeSubject("acme"), data); err != nil {
			t.Fatal(err)
		}
	}
	<-f.js.PublishAsyncComplete()
	for i := range n {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("refusal %d of %d never arrived: %v", i+1, n, err)
		}
		var r job.Result
		if json.Unmarshal(m.Data, &r) != nil || r.Status != job.StatusFailed || r.Error == nil || r.Error.Code != job.CodeInvalidRequest {
			t.Fatalf("refusal %d: %s, want failed invalid_request", i+1, m.Data)
		}
	}
	st, err := f.js.Stream(ctx, streams.Results)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Errorf("RESULTS holds %d messages (%d bytes) after %d invalid jobs; want none stored", info.State.Msgs, info.State.Bytes, n)
	}
	keys, err := f.mesh.Results.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for range keys.Keys() {
		stored++
	}
	if stored != 0 {
		t.Errorf("results bucket holds %d keys; want none", stored)
	}
}

// One tenant's flood of large wait-hint requests leaves another tenant's
// hints answered: all 10 of them, each given 5 s.
func TestWaitHintsSurviveAnotherTenantsFlood(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.run(t)
	// Each tenant on a connection of its own, as producers are.
	conn := func() *nats.Conn {
		nc, err := nats.Connect(f.nc.ConnectedUrl())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	acme, beta := conn(), conn()
	small, _ := json.Marshal(newJob("beta", ""))
	answering(t, beta, "beta", small)
	big, _ := json.Marshal(&task.Task{
		Job: job.Job{Tenant: "acme", Request: json.RawMessage(
			`{"model":"fast","messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum dolor ", 2<<20/18) + `"}]}`)},
	})
	var answered atomic.Int32
	inbox := nats.NewInbox()
	flood, err := acme.Subscribe(inbox, func(*nats.Msg) { answered.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Unsubscribe()
	// The flood goes on while beta asks: beta starts after acme's third.
	const floodN = 8
	started, flooded := make(chan struct{}), make(chan error, 1)
	go func() {
		for i := range floodN {
			if i == 3 {
				close(started)
			}
			if err := acme.PublishRequest(job.WaitSubject("acme"), inbox, big); err != nil {
				flooded <- err
				return
			}
		}
		flooded <- acme.Flush()
	}()
	<-started
	got := 0
	for i := range 10 {
		if _, err := beta.Request(job.WaitSubject("beta"), small, 5*time.Second); err != nil {
			t.Logf("beta's hint %d: %v", i+1, err)
			continue
		}
		got++
	}
	if got != 10 {
		t.Errorf("beta's hints answered during acme's flood: %d of 10, want all", got)
	}
	if err := <-flooded; err != nil {
		t.Fatal(err)
	}
	t.Logf("acme's %d large hint requests: %d answered so far", floodN, answered.Load())
}

// A job id another tenant took first: job ids are unique within a tenant
// only, so this tenant's NATS submission of the same id is a job of its
// own, with its own records and its own place in QUEUE, and the other
// tenant's job is untouched.
func TestSameIDInTwoTenants(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	taken := newJob("beta", "")
	if _, err := f.svc.Accept(ctx, taken); err != nil {
		t.Fatal(err)
	}
	mine := newJob("acme", "")
	mine.ID = taken.ID
	data, _ := json.Marshal(mine)
	if ack, err := f.js.Publish(ctx, job.IntakeSubject("acme"), data); err != nil || ack.Duplicate {
		t.Fatalf("acme's submission: %+v, %v; want stored, not a duplicate", ack, err)
	}
	q, err := f.js.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		info, err := q.Info(ctx, jetstream.WithSubjectFilter(job.QueuePrefix+">"))
		if err == nil && len(info.State.Subjects) != 2 {
			err = fmt.Errorf("QUEUE subjects %v; want one job of each tenant", info.State.Subjects)
		}
		return err
	})
	for _, j := range []*task.Task{taken, mine} {
		rec, _, err := f.mesh.Lookup(ctx, j.Tenant, j.ID)
		if err != nil || rec.Tenant != j.Tenant || rec.JobID != taken.ID || rec.Status != job.StatusQueued {
			t.Errorf("%s's record: %+v, %v; want its own, queued", j.Tenant, rec, err)
		}
		opKey, _ := mesh.OpKey(j.Tenant, "", j.ID)
		if op, _, err := f.mesh.GetOp(ctx, opKey); err != nil || op.Tenant != j.Tenant {
			t.Errorf("%s's operation record: %+v, %v; want its own", j.Tenant, op, err)
		}
	}
}
