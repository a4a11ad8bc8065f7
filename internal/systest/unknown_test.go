package systest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestUnknownOutcomeCalledOnce: the provider takes a standard job's call
// and resets the connection before answering, so whether it did the work
// is unknown. A provider not configured as honouring Idempotency-Key is
// called once: the job ends outcome_unknown, dead-lettered with its
// attempt. One configured as honouring it is called again with the same
// key and the job succeeds.
func TestUnknownOutcomeCalledOnce(t *testing.T) {
	t.Parallel()
	for _, honours := range []bool{false, true} {
		t.Run(fmt.Sprintf("honours=%v", honours), func(t *testing.T) {
			t.Parallel()
			const model = "gpt-4o-mini"
			simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 1000, TPM: 1000000}}, APIKeys: []string{"sim-secret"},
				IgnoreIdempotencyKey: !honours, Faults: sim.Faults{RateReset: 1, MaxFaults: 1}})
			yaml := strings.Replace(SimConfig(simURL, model, 1000, 1000000, ""), "    api_key_env: SIM_KEY\n",
				fmt.Sprintf("    api_key_env: SIM_KEY\n    honours_idempotency_key: %v\n", honours), 1)
			n := Start(t, yaml, Env)
			nc, cl := n.Connect(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := cl.Do(ctx, &job.Job{Tenant: "acme", Priority: job.Standard, Request: ChatBody(model, 5, 16)})
			if err != nil {
				t.Fatal(err)
			}
			st := simSrv.Stats()
			calls := st.Models[model].Admitted // the reset call included
			if honours {
				if res.Status != job.StatusSucceeded || calls != 2 {
					t.Errorf("got %s after %d provider calls, want succeeded after 2 (the same key sent again)", res.Status, calls)
				}
				return
			}
			if res.Status != job.StatusFailed || res.Error == nil || res.Error.Code != dlq.ReasonOutcomeUnknown {
				t.Fatalf("got %s (%+v), want failed outcome_unknown", res.Status, res.Error)
			}
			if calls != 1 || st.ConnResets != 1 {
				t.Errorf("provider saw %d calls (%d reset), want the one that was reset", calls, st.ConnResets)
			}
			js, _ := jetstream.New(nc)
			e, err := dlq.Get(ctx, js, "", res.JobID)
			if err != nil || e.Reason != dlq.ReasonOutcomeUnknown || len(e.Job.Attempts) != 1 {
				t.Errorf("dead letter %+v (%v), want reason outcome_unknown with the one attempt", e, err)
			}
		})
	}
}
