package admission_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/streams"
)

// TestGatedJobPassesTenantGateFree: a job sent back unsent (its instant
// lapsed on a late executor) already paid its tenant's per-day budget when
// first placed; placing it again must not charge it twice. Tenant t may
// make 2 requests a day: 2 readmitted jobs and 2 new ones are all
// dispatched (before task.Task.Gated, the readmitted pair spent the day).
func TestGatedJobPassesTenantGateFree(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js, cfg := queueServer(ctx, t, "{name: t, rpd: 2}")
	m := meshtest.Open(t, js)
	for i := range 4 {
		var j task.Task
		if err := json.Unmarshal(queued(i), &j); err != nil {
			t.Fatal(err)
		}
		j.Gated = i < 2
		data, _ := json.Marshal(j)
		if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, "t"), data); err != nil {
			t.Fatal(err)
		}
	}
	stop := runAdmission(ctx, t, admission.Config{App: cfg}, m)
	defer stop()
	st, err := js.Stream(ctx, streams.Dispatch)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		info, err := st.Info(ctx)
		if err != nil || info.State.Msgs != 4 {
			return fmt.Errorf("DISPATCH: %+v, %v; want 4 jobs there (2 readmitted free, 2 within rpd)", info.State, err)
		}
		return nil
	})
}
