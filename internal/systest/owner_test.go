package systest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestScheduleOwner runs a node with admission.schedule_owner on, under
// its NATS permissions: admission and the executor each route their
// writes of the model's schedule, one of them owns it and serves the
// other. Every job completes, the provider refuses none, and both paths
// (served, forwarded) carried writes.
func TestScheduleOwner(t *testing.T) {
	t.Parallel()
	const jobs = 40
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "owned", RPM: 600, TPM: 1_000_000}}, APIKeys: []string{"sim-secret"}})
	n := StartLogged(t, SimConfig(simURL, "owned", 600, 1_000_000, `
admission:
  schedule_owner: {enabled: true}
`), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, jobs)
	for i := range jobs {
		wg.Go(func() {
			if _, err := httpSubmit(ctx, n.HTTP, Env["ACME_KEY"], ChatBody("owned", 5, 16), true); err != nil {
				errs <- fmt.Errorf("job %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ms := simSrv.Stats().Models["owned"]
	if ms.Requests[200] != jobs || ms.RateLimited != 0 {
		t.Fatalf("the provider answered %d of %d calls, refused %d for rate; want all, none", ms.Requests[200], jobs, ms.RateLimited)
	}
	served := MetricSum(t, n.MetricsURL(), "sluice_budget_owner_writes_total", `path="served"`)
	forwarded := MetricSum(t, n.MetricsURL(), "sluice_budget_owner_writes_total", `path="forwarded"`)
	if served == 0 || forwarded == 0 {
		t.Fatalf("writes served %v, forwarded %v: want both (one service owns the schedule, the other asks it)", served, forwarded)
	}
}
