package admission

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// watchedMsg is a held job's QUEUE message as the watchdog sees it.
type watchedMsg struct {
	bodyMsg
	naks int
}

func (m *watchedMsg) NakWithDelay(time.Duration) error { m.naks++; return nil }

// The watchdog gives back a model's held jobs that saw no dispatch for
// HeldMax, unless the provider paused the model: while health cools it
// after a Retry-After they stay (up to HeldMax*4, as any held job).
func TestWatchdogSparesAPausedModel(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte("providers:\n" + deployment("p", "{name: m, rpm: 60}") + "tenants: [{name: t}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	h := fakeHealth{}
	s := newService(&env{cfg: Config{App: cfg}, now: func() time.Time { return now }, log: slog.New(slog.DiscardHandler), m: metrics.New(prometheus.NewRegistry())})
	s.placer.health = h
	s.holder.heldMax = time.Minute
	msg := &watchedMsg{}
	est := job.Estimate{PromptTokens: 10, MaxTokens: 10}
	s.holder.hold(&Candidate{Job: &task.Task{Job: job.Job{ID: "j", Tenant: "t", Priority: job.Standard, Provider: "p"}, Model: "m", Estimate: &est}, Msg: msg}, now)
	now = now.Add(2 * time.Minute)
	h["p"] = fakeBlock{now.Add(time.Minute), "rate_limited"} // its provider's Retry-After
	s.holder.watchHeld()
	if msg.naks != 0 || s.holder.held.n != 1 {
		t.Fatalf("paused model: %d naks, %d held; want the job kept", msg.naks, s.holder.held.n)
	}
	h["p"] = fakeBlock{reason: "unreachable"} // down: no pause
	s.holder.watchHeld()
	if msg.naks != 1 || s.holder.held.n != 0 {
		t.Fatalf("stalled model: %d naks, %d held; want the job given back", msg.naks, s.holder.held.n)
	}
}
