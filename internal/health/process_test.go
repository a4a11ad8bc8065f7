package health

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-dev/sluice/internal/breaker"
)

// Every Retry-After pauses the deployment's dispatch (the effect), even one
// whose wait the record already holds; the record keeps the longest wait.
func TestCoolPauses(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var mu sync.Mutex
	var paused []time.Time
	pauses := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "p"}, []string{"provider", "model"})
	r := New(Config{KV: f.kv, Deployments: []Deployment{dep}, Holder: "a", Now: f.clk.Now, Pauses: pauses,
		Pause: func(_ context.Context, provider, model string, until time.Time) error {
			if provider != dep.Provider || model != dep.Model {
				t.Errorf("paused %s/%s, want %s/%s", provider, model, dep.Provider, dep.Model)
			}
			mu.Lock()
			defer mu.Unlock()
			paused = append(paused, until)
			return nil
		}})
	ctx := context.Background()
	t0 := f.clk.Now()
	for _, d := range []time.Duration{10 * time.Second, 5 * time.Second} {
		if err := r.Cool(ctx, dep.Provider, dep.Model, t0.Add(d), "rate_limited"); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	got := paused
	mu.Unlock()
	if len(got) != 2 || !got[0].Equal(t0.Add(10*time.Second)) || !got[1].Equal(t0.Add(5*time.Second)) {
		t.Errorf("paused until %v, want each Retry-After's end (10 s, then 5 s)", got)
	}
	var m dto.Metric
	_ = pauses.WithLabelValues(dep.Provider, dep.Model).Write(&m)
	if n := m.GetCounter().GetValue(); n != 2 {
		t.Errorf("pauses counted %v, want 2", n)
	}
	if rec, _ := r.Get(dep.Provider, dep.Model); rec.State != Cooling || !rec.Until.Equal(t0.Add(10*time.Second)) {
		t.Errorf("record %+v, want cooling until the longest wait", rec)
	}
	// An hour's Retry-After cools and pauses for MaxPause, no longer.
	if err := r.Cool(ctx, dep.Provider, dep.Model, t0.Add(time.Hour), "rate_limited"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got = paused
	mu.Unlock()
	if len(got) != 3 || !got[2].Equal(t0.Add(MaxPause)) {
		t.Errorf("paused until %v, want the hour's Retry-After cut to MaxPause (%s)", got, MaxPause)
	}
	if rec, _ := r.Get(dep.Provider, dep.Model); !rec.Until.Equal(t0.Add(MaxPause)) {
		t.Errorf("record %+v, want cooling for MaxPause", rec)
	}
}

// A breaker that opens refuses this process's calls and takes the
// deployment down for the fleet, no probe before the breaker's own.
func TestTakeOpenBreakerTakesDown(t *testing.T) {
	t.Parallel()
	f := setup(t)
	r := New(Config{KV: f.kv, Deployments: []Deployment{dep}, Holder: "a", Now: f.clk.Now,
		Breaker: breaker.Config{MinRequests: 2, OpenFor: 15 * time.Second}})
	ctx := context.Background()
	for range 2 {
		tk, state, _ := r.Take(ctx, dep.Provider, dep.Model)
		if tk == nil || state != breaker.Closed {
			t.Fatalf("closed breaker: ticket %v, state %v", tk, state)
		}
		tk.Record(false)
	}
	if !r.BreakerOpen(dep.Provider, dep.Model) {
		t.Fatal("breaker not open after its failures")
	}
	if r.BreakerOpen("west", dep.Model) {
		t.Error("another deployment's breaker is open")
	}
	tk, state, openUntil := r.Take(ctx, dep.Provider, dep.Model)
	if tk != nil || state != breaker.Open || !openUntil.Equal(f.clk.Now().Add(15*time.Second)) {
		t.Fatalf("open breaker: ticket %v, state %v, open until %v; want none, open, 15 s ahead", tk, state, openUntil)
	}
	rec, _ := r.Get(dep.Provider, dep.Model)
	if rec.State != Down || rec.Reason != "breaker_open" || !rec.Until.Equal(openUntil) {
		t.Errorf("record %+v, want down (breaker_open) until the breaker's probe", rec)
	}
}

// A refused key quarantines its provider's credential in this process for
// CredentialQuarantine; another reason for a down does not.
func TestRefusedKeyQuarantines(t *testing.T) {
	t.Parallel()
	f := setup(t)
	r := New(Config{KV: f.kv, Deployments: []Deployment{dep, {Provider: "west", Model: dep.Model}}, Holder: "a", Now: f.clk.Now})
	ctx := context.Background()
	if err := r.Down(ctx, "west", dep.Model, "unreachable", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if r.CredentialBroken("west") {
		t.Error("an unreachable deployment's credential is quarantined")
	}
	if err := r.Down(ctx, dep.Provider, dep.Model, "auth_401", time.Time{}); err != nil {
		t.Fatal(err)
	}
	// A later refusal starts the quarantine again.
	f.clk.Advance(30 * time.Second)
	if err := r.Down(ctx, dep.Provider, dep.Model, "auth_401", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if !r.CredentialBroken(dep.Provider) {
		t.Error("a refused key's provider is not quarantined")
	}
	f.clk.Advance(CredentialQuarantine - time.Second)
	if !r.CredentialBroken(dep.Provider) {
		t.Error("quarantine ended before a minute after the latest refusal")
	}
	f.clk.Advance(time.Second)
	if r.CredentialBroken(dep.Provider) {
		t.Error("quarantine outlives CredentialQuarantine")
	}
}
