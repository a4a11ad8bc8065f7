package admission

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// fakeHealth blocks the deployments it names (by provider), until when
// and why.
type fakeHealth map[string]fakeBlock

type fakeBlock struct {
	until  time.Time
	reason string
}

func (f fakeHealth) Blocked(provider, _ string, _ time.Time) (time.Time, string, bool) {
	b, ok := f[provider]
	return b.until, b.reason, ok
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
	s.placer.models["rate.c.m"].paceAt = now.Add(time.Second)
	if got := order(); len(got) != 4 || got[1] != "a" || got[2] != "d" || got[3] != "c" {
		t.Fatalf("order with c busy %v, want [b a d c]", got)
	}
	// b sleeps on its budget, a is paused (its provider's Retry-After
	// cools it), d cools: c is what is left.
	b := q.deps[0]
	b.refused = nextSend{at: now.Add(3 * time.Second), look: now.Add(300 * time.Millisecond), reason: "rpm"}
	h["a"] = fakeBlock{now.Add(2 * time.Second), "rate_limited"}
	h["d"] = fakeBlock{now.Add(time.Second), "cooling"}
	if got := order(); len(got) != 1 || got[0] != "c" {
		t.Fatalf("order %v, want [c]", got)
	}
	// None left: the queue wakes when d's cooldown ends, the first back.
	h["c"] = fakeBlock{reason: "cooling"} // until a probe succeeds
	if got := order(); len(got) != 0 {
		t.Fatalf("order %v, want none", got)
	}
	if wake, reason := s.placer.firstWake(q, now); !wake.Equal(now.Add(time.Second)) || reason != "cooling" {
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

// A deployment's next possible send is computed in one place (next):
// the later of its schedule's estimate and health's verdict, with that
// one's reason; a provider's Retry-After (health's cooling, reason
// rate_limited) shows as paused_provider.
func TestNextSend(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(`
providers:
  - {name: a, base_url: http://127.0.0.1:1/v1, models: [{name: m, rpm: 60}]}
  - {name: b, base_url: http://127.0.0.1:1/v1, models: [{name: m, rpm: 60}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	h := fakeHealth{}
	s := newService(&env{cfg: Config{App: cfg}})
	s.placer.health = h
	q := s.holder.queueOf(&task.Task{Job: job.Job{Provider: "a"}, Model: "m"})
	a := s.placer.models["rate.a.m"]
	sec := func(n float64) time.Time { return now.Add(time.Duration(n * float64(time.Second))) }
	for _, tc := range []struct {
		name    string
		refused nextSend
		health  *fakeBlock
		want    nextSend
	}{
		{name: "free"},
		{name: "refused long ago", refused: nextSend{at: sec(-2), look: sec(-3), reason: "rpm"}},
		{name: "schedule only", refused: nextSend{at: sec(3), look: sec(1), reason: "tpm"}, want: nextSend{at: sec(3), look: sec(1), reason: "tpm"}},
		{name: "paused, later than the schedule", refused: nextSend{at: sec(3), look: sec(1), reason: "tpm"},
			health: &fakeBlock{sec(5), "rate_limited"}, want: nextSend{at: sec(5), look: sec(5), reason: "paused_provider"}},
		{name: "schedule later than the cooldown", refused: nextSend{at: sec(9), look: sec(1), reason: "rpm"},
			health: &fakeBlock{sec(2), "rate_limited"}, want: nextSend{at: sec(9), look: sec(2), reason: "rpm"}},
		{name: "down until a probe succeeds", health: &fakeBlock{reason: "auth_401"},
			want: nextSend{at: now.Add(MaxWakeWait), look: now.Add(MaxWakeWait), reason: "auth_401"}},
	} {
		a.refused = tc.refused
		delete(h, "a")
		if tc.health != nil {
			h["a"] = *tc.health
		}
		if got := s.placer.next(a, now); got != tc.want {
			t.Errorf("%s: next = %+v, want %+v", tc.name, got, tc.want)
		}
	}
	// The watchdog spares a queue only while every deployment it may place
	// on is paused by its provider.
	a.refused = nextSend{}
	h["a"] = fakeBlock{sec(5), "rate_limited"}
	if s.placer.paused(q, now) {
		t.Error("paused with b free")
	}
	h["b"] = fakeBlock{reason: "unreachable"}
	if s.placer.paused(q, now) {
		t.Error("paused with b down (not a pause)")
	}
	h["b"] = fakeBlock{sec(1), "rate_limited"}
	if !s.placer.paused(q, now) {
		t.Error("not paused with both cooling after a Retry-After")
	}
	s.placer.health = nil
	if s.placer.paused(q, now) || s.placer.next(a, now) != (nextSend{}) {
		t.Error("no health: a deployment is paused or kept out")
	}
}
