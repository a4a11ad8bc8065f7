package admission

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// fakeHealth blocks the deployments it names.
type fakeHealth map[string]time.Time

func (f fakeHealth) Blocked(provider, _ string, _ time.Time) (time.Time, string, bool) {
	until, ok := f[provider]
	return until, "cooling", ok
}

func names(ms []*modelState) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.provider)
	}
	return out
}

// The order admission tries a group's deployments in: the lowest tier,
// then the one expected to send soonest, then the higher weight; a
// sleeping, paused or blocked one is left out, and the queue wakes when
// the first of those is expected back.
func TestPlacementOrder(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(`
providers:
  - {name: a, base_url: http://127.0.0.1:1/v1, models: [{name: m, tier: 1, rpm: 60}]}
  - {name: b, base_url: http://127.0.0.1:1/v1, models: [{name: m, tier: 0, rpm: 60}]}
  - {name: c, base_url: http://127.0.0.1:1/v1, models: [{name: m, tier: 1, rpm: 60, weight: 2}]}
  - {name: d, base_url: http://127.0.0.1:1/v1, models: [{name: m, tier: 1, rpm: 60}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	h := fakeHealth{}
	s := newService(&env{cfg: Config{App: cfg}})
	s.placer.health = h
	q := s.holder.queueOf(&task.Task{Job: job.Job{Provider: "a"}, Model: "m"})
	if got := names(q.deps); len(got) != 4 || got[0] != "b" || got[1] != "c" {
		t.Fatalf("group deployments %v, want b (tier 0), c (weight 2), then a, d", got)
	}
	c := &Candidate{Job: &task.Task{Model: "m"}}
	order := func() []string {
		o, _ := s.placer.candidates(context.Background(), q, c, now)
		return names(o)
	}
	if got := order(); len(got) != 4 || got[0] != "b" || got[1] != "c" || got[2] != "a" || got[3] != "d" {
		t.Fatalf("idle order %v, want [b c a d]", got)
	}
	// c sent lately: within tier 1, a and d are expected sooner.
	s.placer.models["rate.c.m"].nextAt = now.Add(time.Second)
	if got := order(); len(got) != 4 || got[1] != "a" || got[2] != "d" || got[3] != "c" {
		t.Fatalf("order with c busy %v, want [b a d c]", got)
	}
	// b sleeps on its budget, a is paused, d cools: c is what is left.
	b, a := q.deps[0], s.placer.models["rate.a.m"]
	b.wakeAt, b.freeAt, b.reason = now.Add(300*time.Millisecond), now.Add(3*time.Second), "rpm"
	a.pausedUntil, a.reason = now.Add(2*time.Second), "paused_provider"
	h["d"] = now.Add(time.Second)
	if got := order(); len(got) != 1 || got[0] != "c" {
		t.Fatalf("order %v, want [c]", got)
	}
	// None left: the queue wakes when d's cooldown ends, the first back.
	h["c"] = time.Time{} // until a probe succeeds
	if got := order(); len(got) != 0 {
		t.Fatalf("order %v, want none", got)
	}
	if wake, reason := q.firstWake(now); !wake.Equal(now.Add(time.Second)) || reason != "cooling" {
		t.Fatalf("firstWake = %s, %q; want d's cooldown end (+1s), cooling", wake.Sub(now), reason)
	}
	// A pinned job waits for its own deployment only.
	p := s.holder.queueOf(&task.Task{Job: job.Job{Provider: "d"}, Model: "m", Pinned: true})
	if got := names(p.deps); len(got) != 1 || got[0] != "d" || p == q {
		t.Fatalf("pinned queue deployments %v, want [d] in a queue of its own", got)
	}
}

type nilHealth struct{}

func (*nilHealth) Blocked(string, string, time.Time) (time.Time, string, bool) { panic("called") }

func TestHealthOfNil(t *testing.T) {
	t.Parallel()
	var p *nilHealth
	if healthOf(nil) != nil || healthOf(p) != nil {
		t.Fatal("a nil registry is not nil health")
	}
	if healthOf(fakeHealth{}) == nil {
		t.Fatal("a registry lost")
	}
}
