package systest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/streams"
)

// TestBacklogKeepsToItsTenantsWindow: admission keeps a tenant's waiting
// jobs unacknowledged on QUEUE (held in its fair queues, or deferred by
// redelivery delay), and QUEUE delivers no more than a consumer's
// max_ack_pending. With one consumer for the fleet, one tenant's backlog on
// a 1-RPM model took that whole window and every other tenant's jobs
// stayed undelivered until it drained: a chat to an idle model waited out
// its wait and got 504. Each tenant has its own consumer and window now:
// acme's 200 jobs take its window of 50, and globex's chat to an idle
// model answers well within its 10 s wait.
func TestBacklogKeepsToItsTenantsWindow(t *testing.T) {
	t.Parallel()
	const window, backlog = 50, 200
	_, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "slow"}, {Name: "fast"}}, APIKeys: []string{"sim-secret"}})
	n := StartLogged(t, fmt.Sprintf(`
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: slow, rpm: 1, tpm: 1000000, adaptive: false}
      - {name: fast, rpm: 6000, tpm: 10000000}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
  - {name: globex, api_key_env: GLOBEX_KEY}
admission:
  tenant_window: %d
`, simURL, window), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc, _ := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	for i := range backlog {
		if _, err := httpSubmit(ctx, n.HTTP, Env["ACME_KEY"], ChatBody("slow", 5, 16), false); err != nil {
			t.Fatalf("acme's job %d: %v", i, err)
		}
	}
	// acme's jobs have all reached QUEUE and fill the window admission
	// takes them through (one is dispatched: the model's minute).
	queue, err := js.Stream(ctx, streams.Queue)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 60*time.Second, func() error {
		info, err := queue.Info(ctx)
		if err != nil {
			return err
		}
		taken := 0
		for ci := range queue.ListConsumers(ctx).Info() {
			taken += ci.NumAckPending
		}
		if info.State.Msgs < backlog-1 || taken < window-1 {
			return fmt.Errorf("QUEUE holds %d of acme's %d jobs, admission has taken %d of them, want all but the one dispatched, and a window of %d", info.State.Msgs, backlog, taken, window)
		}
		return nil
	})

	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.HTTP+"/v1/chat/completions", bytes.NewReader(ChatBody("fast", 5, 16)))
	req.Header.Set("Authorization", "Bearer "+Env["GLOBEX_KEY"])
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sluice-Wait-Timeout", "10s")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1000))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		DumpStreams(t, n)
		t.Fatalf("globex's chat to an idle model behind acme's backlog: HTTP %d after %s: %s", resp.StatusCode, time.Since(start).Round(time.Millisecond), body)
	}
	t.Logf("globex's chat answered in %s behind acme's %d waiting jobs", time.Since(start).Round(time.Millisecond), backlog)

	// The bound: acme's consumer has the configured window and holds no more.
	cons, err := js.Consumer(ctx, streams.Queue, keys.AdmissionConsumer("acme"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxAckPending != window || info.NumAckPending > window {
		t.Errorf("acme's QUEUE consumer: max_ack_pending %d with %d taken, want %d and at most that", info.Config.MaxAckPending, info.NumAckPending, window)
	}
}
