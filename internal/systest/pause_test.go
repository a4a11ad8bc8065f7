package systest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestProviderPauseShowsAsPaused: a provider's Retry-After cools its
// deployment for the fleet (internal/health), and a job queued meanwhile
// waits for it, saying so as it always has: paused_provider, until the
// wait is expected to end.
func TestProviderPauseShowsAsPaused(t *testing.T) {
	SkipShort(t)
	t.Parallel()
	const model = "gpt-4o-mini"
	// The provider allows two requests a minute, all at once, and hides its
	// limits (no headers); Sluice is told ten times more, so it draws a 429
	// whose Retry-After runs to the end of the provider's minute.
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 2, TPM: 1_000_000}}, BurstFraction: 1, Profile: sim.ProfileHidden, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, model, 20, 10_000_000, ""), Env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 4 {
		if _, err := cl.Submit(ctx, &job.Job{Tenant: "acme", Request: ChatBody(model, 5, 8)}); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		if got := simSrv.Stats().Models[model].RateLimited; got == 0 {
			return fmt.Errorf("the provider refused nothing yet")
		}
		return nil
	})
	id, err := cl.Submit(ctx, &job.Job{Tenant: "acme", Request: ChatBody(model, 5, 8)})
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.HTTP+"/v1/jobs/"+id, nil)
		req.Header.Set("Authorization", "Bearer acme-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var got struct {
			Status  string
			Waiting struct {
				Reason string
				Until  *time.Time
			}
		}
		_ = json.NewDecoder(resp.Body).Decode(&got)
		if got.Status != "queued" || got.Waiting.Reason != "paused_provider" || got.Waiting.Until == nil {
			return fmt.Errorf("job %d %+v; want queued, waiting for paused_provider until the Retry-After ends", resp.StatusCode, got)
		}
		return nil
	})
}
