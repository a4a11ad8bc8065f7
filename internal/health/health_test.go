package health

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/fakeclock"
	"github.com/sluice-dev/sluice/internal/natstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var dep = Deployment{Provider: "east", Model: "gpt-4o-mini"}

type fleet struct {
	kv  jetstream.KeyValue
	clk *fakeclock.Clock
}

func setup(t *testing.T) *fleet {
	t.Helper()
	nc := natstest.Conn(t, natstest.Server(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "budgets"})
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{kv: kv, clk: fakeclock.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
}

// process starts one process's registry, running until the test ends.
func (f *fleet) process(t *testing.T, holder string, changes *prometheus.CounterVec) *Registry {
	t.Helper()
	r := New(Config{KV: f.kv, Deployments: []Deployment{dep, {Provider: "west", Model: "gpt-4o-mini"}}, Holder: holder, Now: f.clk.Now, Changes: changes})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-r.Loaded():
	case <-time.After(10 * time.Second):
		t.Fatal("registry did not load")
	}
	return r
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	natstest.Eventually(t, 10*time.Second, func() error {
		if !cond() {
			return errors.New(what)
		}
		return nil
	})
}

func TestLongestWaitWins(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, b := f.process(t, "a", nil), f.process(t, "b", nil)
	ctx := context.Background()
	t0 := f.clk.Now()
	if err := a.Cool(ctx, dep.Provider, dep.Model, t0.Add(10*time.Second), "rate_limited"); err != nil {
		t.Fatal(err)
	}
	if err := b.Cool(ctx, dep.Provider, dep.Model, t0.Add(5*time.Second), "rate_limited"); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*Registry{"a": a, "b": b} {
		eventually(t, name+" sees the 10-s wait", func() bool {
			until, reason, blocked := r.Blocked(dep.Provider, dep.Model, t0)
			return blocked && until.Equal(t0.Add(10*time.Second)) && reason == "rate_limited"
		})
	}
	if err := b.Cool(ctx, dep.Provider, dep.Model, t0.Add(20*time.Second), "rate_limited"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a sees the 20-s wait", func() bool {
		until, _, _ := a.Blocked(dep.Provider, dep.Model, t0)
		return until.Equal(t0.Add(20 * time.Second))
	})
	if _, _, blocked := a.Blocked("west", dep.Model, t0); blocked {
		t.Error("another deployment of the group is blocked too")
	}
	// A deployment that is down stays down when a Retry-After comes.
	if err := a.Down(ctx, "west", dep.Model, "auth_401", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Cool(ctx, "west", dep.Model, t0.Add(time.Minute), "rate_limited"); err != nil {
		t.Fatal(err)
	}
	if rec, _ := a.Get("west", dep.Model); rec.State != Down || !rec.Until.Equal(t0.Add(time.Minute)) {
		t.Errorf("down, then cooled: got %+v, want down until the cooling's end", rec)
	}
}

// When the wait ends, exactly one process of the fleet takes the probe; the
// others keep the deployment blocked until the probe's call succeeds.
func TestOneProbeTaker(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	regs := make([]*Registry, 5)
	for i := range regs {
		regs[i] = f.process(t, fmt.Sprintf("p%d", i), nil)
	}
	t0 := f.clk.Now()
	if err := regs[0].Cool(ctx, dep.Provider, dep.Model, t0.Add(time.Second), "rate_limited"); err != nil {
		t.Fatal(err)
	}
	for _, r := range regs {
		eventually(t, "every process sees the wait", func() bool {
			_, _, blocked := r.Blocked(dep.Provider, dep.Model, t0)
			return blocked
		})
	}
	f.clk.Advance(2 * time.Second)
	now := f.clk.Now()
	// Every process asks at once (Blocked asks its Run to take the probe).
	var wg sync.WaitGroup
	for _, r := range regs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Blocked(dep.Provider, dep.Model, now)
		}()
	}
	wg.Wait()
	var open []int
	eventually(t, "one process holds the probe and every process knows it", func() bool {
		open = open[:0]
		for i, r := range regs {
			rec, _ := r.Get(dep.Provider, dep.Model)
			if rec.Probe == "" {
				r.Blocked(dep.Provider, dep.Model, now)
				return false
			}
			if _, _, blocked := r.Blocked(dep.Provider, dep.Model, now); !blocked {
				open = append(open, i)
			}
		}
		return len(open) == 1
	})
	// Taking it again directly changes nothing.
	for i, r := range regs {
		got, err := r.TakeProbe(ctx, dep.Provider, dep.Model)
		if err != nil {
			t.Fatal(err)
		}
		if want := i == open[0]; got != want {
			t.Errorf("process %d: TakeProbe = %v, want %v", i, got, want)
		}
	}
	// A call sent before the cooling began proves nothing; one sent by the
	// probe, after, opens the deployment to everyone.
	if err := regs[open[0]].Up(ctx, dep.Provider, dep.Model, t0.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, _, blocked := regs[(open[0]+1)%len(regs)].Blocked(dep.Provider, dep.Model, now); !blocked {
		t.Fatal("a stale success opened the deployment")
	}
	if err := regs[open[0]].Up(ctx, dep.Provider, dep.Model, now); err != nil {
		t.Fatal(err)
	}
	for i, r := range regs {
		eventually(t, fmt.Sprintf("process %d sees it up", i), func() bool {
			_, _, blocked := r.Blocked(dep.Provider, dep.Model, now)
			return !blocked
		})
	}
}

// A lease nobody uses lapses and another process takes it.
func TestProbeLeaseLapses(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a, b := f.process(t, "a", nil), f.process(t, "b", nil)
	if err := a.Down(ctx, dep.Provider, dep.Model, "unreachable", time.Time{}); err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(FirstBackoff)
	if ok, err := a.TakeProbe(ctx, dep.Provider, dep.Model); err != nil || !ok {
		t.Fatalf("a: TakeProbe = %v, %v; want true", ok, err)
	}
	if ok, _ := b.TakeProbe(ctx, dep.Provider, dep.Model); ok {
		t.Fatal("b took a probe a holds")
	}
	f.clk.Advance(DefaultProbeLease)
	if ok, err := b.TakeProbe(ctx, dep.Provider, dep.Model); err != nil || !ok {
		t.Fatalf("b after the lease: TakeProbe = %v, %v; want true", ok, err)
	}
}

// A failed probe doubles the wait before the next one; calls failing while
// the deployment is down and waiting change nothing.
func TestDownBacksOff(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	changes := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"provider", "model", "state"})
	a := f.process(t, "a", changes)
	for range 3 {
		if err := a.Down(ctx, dep.Provider, dep.Model, "auth_401", time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	rec, _ := a.Get(dep.Provider, dep.Model)
	if rec.Failures != 1 || !rec.Until.Equal(f.clk.Now().Add(FirstBackoff)) {
		t.Fatalf("after three failures while down: %+v, want one failure and the first backoff", rec)
	}
	f.clk.Advance(FirstBackoff) // the probe fails
	if err := a.Down(ctx, dep.Provider, dep.Model, "auth_401", time.Time{}); err != nil {
		t.Fatal(err)
	}
	rec, _ = a.Get(dep.Provider, dep.Model)
	if rec.Failures != 2 || !rec.Until.Equal(f.clk.Now().Add(2*FirstBackoff)) {
		t.Fatalf("after a failed probe: %+v, want two failures and twice the backoff", rec)
	}
	var m dto.Metric
	_ = changes.WithLabelValues(dep.Provider, dep.Model, "down").Write(&m)
	if got := m.GetCounter().GetValue(); got != 1 {
		t.Errorf("down changes counted: %v, want 1", got)
	}
	if backoff(100) != MaxBackoff {
		t.Errorf("backoff(100) = %v, want %v", backoff(100), MaxBackoff)
	}
}

// A process that starts later reads the state the fleet wrote.
func TestRestartReadsState(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	a := f.process(t, "a", nil)
	if err := a.Down(ctx, dep.Provider, dep.Model, "auth_403", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Cool(ctx, "west", dep.Model, f.clk.Now().Add(time.Minute), "rate_limited"); err != nil {
		t.Fatal(err)
	}
	b := f.process(t, "b", nil)
	if until, reason, blocked := b.Blocked(dep.Provider, dep.Model, f.clk.Now()); !blocked || reason != "auth_403" || !until.IsZero() {
		t.Errorf("down deployment: Blocked = %v, %q, %v; want blocked until a probe, auth_403", until, reason, blocked)
	}
	if until, _, blocked := b.Blocked("west", dep.Model, f.clk.Now()); !blocked || !until.Equal(f.clk.Now().Add(time.Minute)) {
		t.Errorf("cooling deployment: Blocked = %v, %v; want blocked for a minute", until, blocked)
	}
	if _, _, blocked := b.Blocked("nowhere", dep.Model, f.clk.Now()); blocked {
		t.Error("an unknown deployment is blocked")
	}
	if err := b.Down(ctx, "nowhere", dep.Model, "x", time.Time{}); err == nil {
		t.Error("Down of an unknown deployment: want an error")
	}
}

// TestSetAddsAndRemoves: a reload's deployments: one added is known at
// once (its record is written and watched, /readyz counts it), one removed
// is not.
func TestSetAddsAndRemoves(t *testing.T) {
	f := setup(t)
	r := f.process(t, "h1", nil) // east and west
	ctx := context.Background()
	added := Deployment{Provider: "north", Model: "gpt-4o-mini"}
	if err := r.Down(ctx, added.Provider, added.Model, "auth", time.Time{}); !errors.Is(err, ErrUnknown) {
		t.Fatalf("Down of an unconfigured deployment: %v, want ErrUnknown", err)
	}
	r.Set([]Deployment{dep, added})
	if err := r.Down(ctx, added.Provider, added.Model, "auth", time.Time{}); err != nil {
		t.Fatalf("Down of a deployment a reload added: %v", err)
	}
	if err := r.Down(ctx, "west", "gpt-4o-mini", "auth", time.Time{}); !errors.Is(err, ErrUnknown) {
		t.Errorf("Down of a deployment a reload removed: %v, want ErrUnknown", err)
	}
	eventually(t, "the added deployment seen down", func() bool {
		down, n := r.DownNow()
		return n == 2 && len(down) == 1 && down[0] == "north/gpt-4o-mini"
	})
}
