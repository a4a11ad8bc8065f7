package systest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestLargeBodyBytesStillChecked: QUEUE and DISPATCH carry a large body as
// its bytes (task.Decode leaves its syntax to the seal), so a forged
// message whose large body is not JSON, under no valid seal, is checked
// where the seal fails: it ends failed invalid_request and never reaches
// the provider. (Before, such a message did not decode at all and was
// dropped without a result.)
func TestLargeBodyBytesStillChecked(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 1_000_000}}, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 600, 1_000_000, ""), Env)
	nc, _ := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Valid JSON up to its last member, whose value is not a literal.
	body := `{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 200) + `"}],"n":tru}`
	now := time.Now().UTC().Format(time.RFC3339Nano)
	far := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC).Format(time.RFC3339Nano)
	ids := map[string]string{job.QueueSubject(job.Standard, "acme"): job.NewID(), job.DispatchSubject("sim", "gpt-4o-mini"): job.NewID()}
	for subject, id := range ids {
		data := `{"id":"` + id + `","tenant":"acme","priority":"standard","provider":"sim","request":` + body +
			`,"submitted_at":"` + now + `","model":"gpt-4o-mini","estimate":{"prompt_tokens":300,"max_tokens":8},"seal":"forged"` +
			`,"reservation":{"id":"1-0","requests":1,"tokens":308,"reserved_at":"` + now + `","valid_until":"` + far + `","sig":"forged"}}`
		msg := nats.NewMsg(subject)
		msg.Data = []byte(data)
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatalf("publish %s: %v", subject, err)
		}
	}
	for subject, id := range ids {
		v := waitJobAs(t, n.HTTP, id)
		res, _ := v["result"].(map[string]any)
		e, _ := res["error"].(map[string]any)
		if v["status"] != string(job.StatusFailed) || e["code"] != job.CodeInvalidRequest {
			t.Errorf("%s: got %v, want failed invalid_request", subject, v)
		}
		if got := simSrv.Stats().JobCompletions[id]; got != 0 {
			t.Errorf("%s: the job reached the provider %d times, want 0", subject, got)
		}
	}
}
