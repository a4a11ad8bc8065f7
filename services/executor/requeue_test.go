package executor

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// TestRequeueBound: a job whose reservation keeps lapsing goes back to
// admission backLapsed.bound times in a row, then ends dead-lettered
// requeue_limit with the metric counted, never calling the provider; a
// call in between starts the count again.
func TestRequeueBound(t *testing.T) {
	t.Parallel()
	f := setup(t, answer(200, nil, okBody))
	ctx := context.Background()
	j := f.job(t, "t")
	for i := range backLapsed.bound + 1 {
		j.Reservation = &task.Reservation{ID: "1-0", Requests: 1, Tokens: 26, ReservedAt: time.Now().UTC(), ValidUntil: time.Now().Add(-time.Second).UTC()}
		if err := f.s.execute(ctx, &dispatched{seq: uint64(100 + i)}, j); err != nil {
			t.Fatal(err)
		}
		if i == backLapsed.bound {
			break
		}
		j = f.queued(t)
		if q := j.Requeued; q == nil || q.Reason != backLapsed.name || q.N != i+1 {
			t.Fatalf("return %d: requeued %+v, want %s %d", i+1, q, backLapsed.name, i+1)
		}
	}
	if n := f.client.made(); n != 0 {
		t.Fatalf("provider calls %d, want 0", n)
	}
	r := f.result(t, j)
	if r.Status != job.StatusDeadLettered || r.Error == nil || r.Error.Code != job.CodeRequeueLimit {
		t.Fatalf("result %s %+v, want dead_lettered %s", r.Status, r.Error, job.CodeRequeueLimit)
	}
	if got := count(f.s.m.RequeueLimited.WithLabelValues("p", "m", backLapsed.name)); got != 1 {
		t.Errorf("requeue limited %v, want 1", got)
	}
	if got := count(f.s.m.Requeues.WithLabelValues("p", "m", backLapsed.name)); got != float64(backLapsed.bound+1) {
		t.Errorf("requeues %v, want %d", got, backLapsed.bound+1)
	}

	// A call since the last return, or another reason, starts a new run.
	k := f.job(t, "t")
	k.Requeued = &task.Requeued{Reason: backLapsed.name, N: backLapsed.bound, Calls: 0}
	k.Attempts = []job.Attempt{{N: 1, Provider: "p", Model: "m"}}
	k.Reservation.ValidUntil = time.Now().Add(-time.Second).UTC()
	if err := f.s.execute(ctx, &dispatched{seq: 500}, k); err != nil {
		t.Fatal(err)
	}
	if q := f.queued(t); q.ID != k.ID || q.Requeued == nil || q.Requeued.N != 1 || q.Requeued.Calls != 1 {
		t.Fatalf("after a call: queued %s requeued %+v, want %s with a new run of 1", q.ID, q.Requeued, k.ID)
	}
}
