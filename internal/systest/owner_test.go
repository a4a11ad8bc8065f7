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
// writes of the model's schedule through its owner. Every job completes,
// the provider refuses none, and the owner served the writes.
func TestScheduleOwner(t *testing.T) {
	t.Parallel()
	const jobs = 40
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "owned", RPM: 600, TPM: 1_000_000}}, APIKeys: []string{"sim-secret"}})
	n := StartLogged(t, SimConfig(simURL, "owned", 600, 1_000_000, `
admission:
  schedule_owner: {enabled: true, wait: 5s}
`), Env) // wait: an asker on a loaded machine (-race, CI) waits for the owner's answer instead of writing the KV itself
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
	// At most one refusal to jitter (a call a loaded machine delivered past
	// send_tolerance), never an accepted second over the cap.
	if ms.Requests[200] != jobs || ms.RateLimited > 1 || ms.MaxAdmittedRequestsIn1s > ms.BurstRequests {
		t.Fatalf("the provider answered %d of %d calls (at most %d in a second, cap %d), refused %d for rate; want all, within the cap",
			ms.Requests[200], jobs, ms.MaxAdmittedRequestsIn1s, ms.BurstRequests, ms.RateLimited)
	}
	served := MetricSum(t, n.MetricsURL(), "sluice_budget_owner_writes_total", `path="served"`)
	forwarded := MetricSum(t, n.MetricsURL(), "sluice_budget_owner_writes_total", `path="forwarded"`)
	fallback := MetricSum(t, n.MetricsURL(), "sluice_budget_owner_writes_total", `path="fallback"`)
	t.Logf("writes served %v, forwarded %v, fallback %v", served, forwarded, fallback)
	// Admission's writes (its placements) are most of the schedule's; in
	// one node the executor's may be none to forward, so only the owner's
	// serving is required here. Forwarding between processes, and what
	// the KV holds after it, is budget's TestOwnerServes.
	if served == 0 {
		t.Fatalf("writes served %v, forwarded %v, fallback %v: want the owner to serve the schedule's writes", served, forwarded, fallback)
	}
}
