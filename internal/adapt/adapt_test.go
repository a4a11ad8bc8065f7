package adapt_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/fakeclock"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/provider"
)

func bucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	nc := natstest.Conn(t, natstest.Server(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "budgets"})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

const key = "learn.sim.gpt-4o-mini"

var cfg = adapt.Config{RPM: 600, TPM: 600_000, Adapts: true, BurstFraction: 1.0 / 60}

// TestOneEpochCutsOnce: 30 burst refusals of calls reserved before the
// first cut (they were all in flight when it came) cut the per-second cap
// once; a refusal of a call reserved after the cut cuts again.
func TestOneEpochCutsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := fakeclock.New(time.Unix(1_750_000_000, 0))
	st := adapt.NewStore(bucket(t), c.Now)
	reserved := c.Now().Add(-200 * time.Millisecond)
	cuts := 0
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cut, _, err := st.Cut(ctx, key, cfg, adapt.Refusal{Kind: provider.LimitBurst, Dim: adapt.Requests, ReservedAt: reserved, RetryAfter: 300 * time.Millisecond})
			if err != nil {
				t.Error(err)
			}
			if cut {
				mu.Lock()
				cuts++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if cuts != 1 {
		t.Fatalf("30 refusals of one epoch cut %d times, want 1", cuts)
	}
	rec, _, err := st.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	e := adapt.Compute(cfg, rec, c.Now())
	if want := 8; e.PerSecond[adapt.Requests] != want { // ceil(10 × 0.75)
		t.Errorf("per-second requests after one cut %d, want %d", e.PerSecond[adapt.Requests], want)
	}
	if e.PerMinute[adapt.Requests] != 600 {
		t.Errorf("a burst cut moved the minute limit to %d", e.PerMinute[adapt.Requests])
	}
	// Calls reserved after the cut (and its propagation) are new evidence:
	// the second refusal of them cuts.
	c.Advance(2 * time.Second)
	for i, want := range []bool{false, true} {
		cut, _, err := st.Cut(ctx, key, cfg, adapt.Refusal{Kind: provider.LimitBurst, Dim: adapt.Requests, ReservedAt: c.Now()})
		if err != nil || cut != want {
			t.Fatalf("refusal %d of the next epoch: cut %v, err %v; want %v", i+1, cut, err, want)
		}
	}
}

// TestBurstConfirm: a burst refusal alone does not cut (it may be the
// mesh's own timing); one that follows another within BurstConfirm does.
func TestBurstConfirm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := fakeclock.New(time.Unix(1_750_000_000, 0))
	st := adapt.NewStore(bucket(t), c.Now)
	refuse := func() bool {
		t.Helper()
		cut, _, err := st.Cut(ctx, key, cfg, adapt.Refusal{Kind: provider.LimitBurst, Dim: adapt.Requests, ReservedAt: c.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return cut
	}
	perSecond := func() int {
		t.Helper()
		rec, _, err := st.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return adapt.Compute(cfg, rec, c.Now()).PerSecond[adapt.Requests]
	}
	if refuse() || perSecond() != 10 {
		t.Fatalf("one burst refusal alone cut the per-second cap to %d", perSecond())
	}
	c.Advance(adapt.BurstConfirm + time.Second)
	if refuse() || perSecond() != 10 {
		t.Fatalf("a burst refusal %v after the last one cut the per-second cap to %d", adapt.BurstConfirm+time.Second, perSecond())
	}
	c.Advance(5 * time.Second)
	if !refuse() || perSecond() != 8 {
		t.Fatalf("a second burst refusal 5 s after another: per-second cap %d, want it cut to 8", perSecond())
	}
}

// TestRestartedFleetStartsWarm: what one set of processes learned is what a
// new store (a restarted fleet) computes, with no warm-up from scratch.
func TestRestartedFleetStartsWarm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := fakeclock.New(time.Unix(1_750_000_000, 0))
	kv := bucket(t)
	first := adapt.NewStore(kv, c.Now)
	if _, err := first.Start(ctx, key, cfg); err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Minute)
	// A hidden per-minute limit: refused with the fleet's window at 400.
	cut, reason, err := first.Cut(ctx, key, cfg, adapt.Refusal{Kind: provider.LimitMinute, Dim: adapt.Requests, ReservedAt: c.Now(),
		Used: budget.Cost{Requests: 400, Tokens: 40_000}, Stated: [adapt.Dims]int{-1, -1}})
	if err != nil || !cut || reason != "minute" {
		t.Fatalf("minute refusal: cut %v reason %q err %v", cut, reason, err)
	}
	c.Advance(5 * time.Second)
	again := adapt.NewStore(kv, c.Now) // a new process
	if _, err := again.Start(ctx, key, cfg); err != nil {
		t.Fatal(err)
	}
	rec, _, err := again.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	e := adapt.Compute(cfg, rec, c.Now())
	if want := 388; e.PerMinute[adapt.Requests] != want { // 400 × 0.97
		t.Errorf("restarted fleet's requests per minute %d, want the learned %d", e.PerMinute[adapt.Requests], want)
	}
	if e.Ramp != 1 {
		t.Errorf("restarted fleet warms up (ramp %g); it should start from the learned rate", e.Ramp)
	}
	// Recovery: nothing during Settle, then a slow probe, never above the
	// configuration.
	if e2 := adapt.Compute(cfg, rec, c.Now().Add(adapt.Settle-10*time.Second)); e2.PerMinute[0] != 388 {
		t.Errorf("probing during Settle: %d", e2.PerMinute[0])
	}
	if e3 := adapt.Compute(cfg, rec, c.Now().Add(adapt.Settle+time.Minute)); e3.PerMinute[0] <= 388 || e3.PerMinute[0] > 400 {
		t.Errorf("a minute into the probe: %d, want a little above 388", e3.PerMinute[0])
	}
	if e4 := adapt.Compute(cfg, rec, c.Now().Add(time.Hour)); e4.PerMinute[0] != 600 {
		t.Errorf("an hour later: %d, want the configured 600", e4.PerMinute[0])
	}
}

// TestStatedAndDiscovered: a stated limit lower than the configuration is
// adopted at once and never exceeded; a 0 limit with adaptive: true is
// discovered from a low start.
func TestStatedAndDiscovered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := fakeclock.New(time.Unix(1_750_000_000, 0))
	st := adapt.NewStore(bucket(t), c.Now)
	twice := adapt.Config{RPM: 1200, TPM: 1_200_000, Adapts: true, BurstFraction: 1.0 / 60}
	if err := st.Observe(ctx, key, twice, [adapt.Dims]int{600, 600_000}); err != nil {
		t.Fatal(err)
	}
	rec, _, _ := st.Get(ctx, key)
	e := adapt.Compute(twice, rec, c.Now())
	if e.PerMinute != [adapt.Dims]int{600, 600_000} || e.PerSecond != [adapt.Dims]int{10, 10_000} {
		t.Errorf("configured twice the stated: in effect %v per minute, %v per second; want the stated", e.PerMinute, e.PerSecond)
	}
	// Stated higher than configured: the configuration still rules.
	if err := st.Observe(ctx, key, twice, [adapt.Dims]int{5000, 5_000_000}); err != nil {
		t.Fatal(err)
	}
	rec, _, _ = st.Get(ctx, key)
	if e := adapt.Compute(twice, rec, c.Now()); e.PerMinute != [adapt.Dims]int{1200, 1_200_000} {
		t.Errorf("stated above the configuration: in effect %v", e.PerMinute)
	}

	disc := adapt.Config{Adapts: true, Discovers: true, BurstFraction: 1.0 / 60}
	k2 := key + "-discover"
	if _, err := st.Start(ctx, k2, disc); err != nil {
		t.Fatal(err)
	}
	rec, _, _ = st.Get(ctx, k2)
	if e := adapt.Compute(disc, rec, c.Now()); e.PerMinute != [adapt.Dims]int{adapt.DiscoverStart[0] / 2, adapt.DiscoverStart[1] / 2} {
		t.Errorf("discovery starts at %v, want half of %v (warming up)", e.PerMinute, adapt.DiscoverStart)
	}
	if e := adapt.Compute(disc, rec, c.Now().Add(2*adapt.DiscoverDoubling)); e.PerMinute[0] != 4*adapt.DiscoverStart[0] {
		t.Errorf("after two doublings %d", e.PerMinute[0])
	}
	if err := st.Observe(ctx, k2, disc, [adapt.Dims]int{3000, 2_000_000}); err != nil {
		t.Fatal(err)
	}
	rec, _, _ = st.Get(ctx, k2)
	if e := adapt.Compute(disc, rec, c.Now().Add(adapt.Ramp)); e.PerMinute != [adapt.Dims]int{3000, 2_000_000} {
		t.Errorf("discovered with headers: %v, want what they state", e.PerMinute)
	}
	// Quota refusals never adapt.
	if cut, _, _ := st.Cut(ctx, key, twice, adapt.Refusal{Kind: provider.LimitQuota, ReservedAt: c.Now().Add(time.Hour)}); cut {
		t.Error("a quota refusal cut the limits")
	}
}

// TestNewModelWarmsUpOnlyWhereAsked: a model the fleet has never seen
// starts at half its limits and ramps up when its provider asks for load to
// grow gradually (the default Config, anthropic and azure models); with
// NoWarmUp (openai models) it starts at its limits: the ramp cost a token
// benchmark's fresh fleet 2.5 s of its first minute. An acceleration
// refusal still starts a warm-up.
func TestNewModelWarmsUpOnlyWhereAsked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		noWarmUp bool
		want     float64
	}{{"warms up", false, 0.5}, {"starts at its limits", true, 1}} {
		c := fakeclock.New(time.Unix(1_750_000_000, 0))
		st := adapt.NewStore(bucket(t), c.Now)
		conf := cfg
		conf.NoWarmUp = tc.noWarmUp
		rec, err := st.Start(ctx, key, conf)
		if err != nil {
			t.Fatal(err)
		}
		if e := adapt.Compute(conf, rec, c.Now()); e.Ramp != tc.want {
			t.Errorf("%s: a new model's ramp %g, want %g", tc.name, e.Ramp, tc.want)
		}
		c.Advance(time.Minute)
		if _, _, err := st.Cut(ctx, key, conf, adapt.Refusal{Kind: provider.LimitAcceleration, Dim: adapt.Requests, ReservedAt: c.Now(),
			Stated: [adapt.Dims]int{-1, -1}}); err != nil {
			t.Fatal(err)
		}
		rec, _, err = st.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if e := adapt.Compute(conf, rec, c.Now()); e.Ramp != 0.5 {
			t.Errorf("%s: after an acceleration refusal the ramp is %g, want 0.5", tc.name, e.Ramp)
		}
	}
}
