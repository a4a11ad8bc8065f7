package budget_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
)

// pacedParams are the configuration's defaults for a provider model.
var pacedParams = budget.Params{Slice: 250 * time.Millisecond, BurstFraction: 1.0 / 60,
	Short: time.Second, Lead: 20 * time.Millisecond, Tolerance: 25 * time.Millisecond, Horizon: 2 * time.Second}

// send is one call as the provider sees it.
type send struct {
	at   time.Time
	r, t int
}

// strictProvider checks sends the way a provider that quantizes per second
// does: a sliding 60-s window at the limits, and a sliding 1-s window at
// ceil(limit/60) in which a request larger than the cap is admitted only
// alone. It returns how many sends it would have refused.
func strictProvider(sends []send, rpm, tpm int) (refused int) {
	sort.Slice(sends, func(i, j int) bool { return sends[i].at.Before(sends[j].at) })
	capR, capT := (rpm+59)/60, (tpm+59)/60
	for i, s := range sends {
		var r1, t1, r60, t60 int
		for _, p := range sends[:i] {
			d := s.at.Sub(p.at)
			if d < time.Second {
				r1 += p.r
				t1 += p.t
			}
			if d < time.Minute {
				r60 += p.r
				t60 += p.t
			}
		}
		switch {
		case rpm > 0 && r60+s.r > rpm, tpm > 0 && t60+s.t > tpm:
			refused++
		case rpm > 0 && r1+s.r > capR:
			refused++
		case tpm > 0 && t1 > 0 && t1+s.t > capT:
			refused++
		}
	}
	return refused
}

// bucketProvider checks sends the way pkg/sim's token-bucket profile does:
// per dimension a bucket of a second's refill (limit/60), refilled
// continuously at limit a minute; a send needs the bucket to hold its cost,
// or to be full when it costs more, and empties it at most. It returns how
// many sends it would have refused.
func bucketProvider(sends []send, rpm, tpm int) (refused int) {
	sort.Slice(sends, func(i, j int) bool { return sends[i].at.Before(sends[j].at) })
	type bucket struct{ level, capacity, rate float64 }
	mk := func(limit int) *bucket {
		if limit == 0 {
			return nil
		}
		return &bucket{level: float64(limit) / 60, capacity: float64(limit) / 60, rate: float64(limit) / 60}
	}
	bs := [2]*bucket{mk(rpm), mk(tpm)}
	var last time.Time
	for i, s := range sends {
		ok := true
		amounts := [2]float64{float64(s.r), float64(s.t)}
		for k, b := range bs {
			if b == nil {
				continue
			}
			if i > 0 {
				b.level = min(b.capacity, b.level+b.rate*s.at.Sub(last).Seconds())
			}
			if b.level+1e-6 < min(amounts[k], b.capacity) {
				ok = false
			}
		}
		last = s.at
		if !ok {
			refused++
			continue
		}
		for k, b := range bs {
			if b != nil {
				b.level = max(b.level-amounts[k], 0)
			}
		}
	}
	return refused
}

// TestPacedScheduleHoldsAtTheProvider has three admission processes take
// costs from one paced store at random moments, and executors send each at
// its SendAt plus a random delay within the tolerance. A provider that
// quantizes per second must refuse none of them, and the minute must be
// nearly full once backlogged.
func TestPacedScheduleHoldsAtTheProvider(t *testing.T) {
	if testing.Short() {
		t.Skip("long simulated schedules, about 5-7 s: the full tier runs it, not -short")
	}
	t.Parallel()
	for _, tc := range []struct {
		name     string
		rpm, tpm int
		cost     func(*rand.Rand) budget.Cost
		minFill  float64 // of the binding limit over the second minute
		binding  string
		idle     float64 // the share of steps that ask for nothing
	}{
		// 150 RPM: a cap of 3 per second for 2.5 per second on average.
		{"small requests, RPM-bound", 150, 10_000_000, func(*rand.Rand) budget.Cost { return budget.Cost{Requests: 1, Tokens: 200} }, 0.97, "rpm", 0},
		// 150,000 TPM: a cap of 2,500 tokens per second; every job is
		// larger and needs a second of its own.
		{"large requests, TPM-bound", 10_000, 150_000, func(r *rand.Rand) budget.Cost {
			return budget.Cost{Requests: 1, Tokens: 4500 + r.IntN(1000)}
		}, 0.97, "tpm", 0},
		// 600 RPM: the per-second cap equals the average pace.
		{"RPM 600, cap equal to the pace", 600, 10_000_000, func(*rand.Rand) budget.Cost { return budget.Cost{Requests: 1, Tokens: 100} }, 0.96, "rpm", 0},
		// Jobs of 100-6,100 tokens against a cap equal to the average pace
		// (10,000 a second): a sliding window that must hold the next job
		// whole idles about half a job per second, whoever sends.
		{"mixed sizes below the cap, TPM-bound", 10_000, 600_000, func(r *rand.Rand) budget.Cost {
			return budget.Cost{Requests: 1, Tokens: 100 + r.IntN(6_000)}
		}, 0.83, "tpm", 0},
		// The demo's jobs: 94-494 tokens against a 2,000-token cap.
		{"demo-sized jobs, TPM-bound", 600, 120_000, func(r *rand.Rand) budget.Cost {
			return budget.Cost{Requests: 1, Tokens: 94 + r.IntN(400)}
		}, 0.80, "tpm", 0},
		// Jobs up to 1.2x the per-second cap: one larger than the cap waits
		// for an empty window behind smaller ones, in fair order.
		{"mixed sizes around the cap, TPM-bound", 10_000, 600_000, func(r *rand.Rand) budget.Cost {
			return budget.Cost{Requests: 1, Tokens: 100 + r.IntN(12_000)}
		}, 0.78, "tpm", 0},
		// Jobs of 3,050-3,770 tokens against a 3,334-token cap (TPM
		// 200,000; the bench's tokens-low): no two share a second, and
		// the pace of one below the cap is shorter than the second it
		// must wait. That wait is not lost to the pace: the next job,
		// paced longer than its second, takes it back.
		{"jobs around the cap, TPM-bound", 10_000, 200_000, func(r *rand.Rand) budget.Cost {
			return budget.Cost{Requests: 1, Tokens: 3050 + r.IntN(720)}
		}, 0.985, "tpm", 0},
		// Arrivals offered at about the limit, coming and going, with a
		// 200-ms lead: calls planned with room may leave at once
		// (Grant.From), the others at their instants; the provider refuses
		// none either way.
		{"intermittent, RPM-bound", 150, 10_000_000, func(*rand.Rand) budget.Cost { return budget.Cost{Requests: 1, Tokens: 200} }, 0, "rpm", 0.972},
		{"intermittent, TPM-bound", 10_000, 150_000, func(r *rand.Rand) budget.Cost {
			return budget.Cost{Requests: 1, Tokens: 1000 + r.IntN(3000)}
		}, 0, "tpm", 0.989},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := pacedParams
			if tc.idle > 0 {
				p.Lead = 200 * time.Millisecond
			}
			b := setup(t, p)
			rnd := rand.New(rand.NewPCG(1, 2))
			ctx := context.Background()
			lim := budget.Limits{RPM: tc.rpm, TPM: tc.tpm}
			var sends []send
			early := 0
			// 150 s of 50-ms steps; each step one of three processes asks
			// for a batch of up to 8 jobs (always backlogged).
			for step := 0; step < 3000; step++ {
				now := b.clock.Advance(50 * time.Millisecond)
				if rnd.Float64() < tc.idle {
					continue
				}
				batch := make([]budget.Cost, 1+rnd.IntN(8))
				for i := range batch {
					batch[i] = tc.cost(rnd)
				}
				g, err := b.store.Take(ctx, key, lim, batch)
				if err != nil {
					t.Fatal(err)
				}
				if g.N != len(g.SendAt) || g.N != len(g.From) {
					t.Fatalf("grant of %d with %d send instants, %d earliest", g.N, len(g.SendAt), len(g.From))
				}
				for i := range g.N {
					if g.SendAt[i].Before(now) {
						t.Fatalf("send instant %v before now %v", g.SendAt[i], now)
					}
					if g.SendAt[i].After(now.Add(p.Horizon)) {
						t.Fatalf("send instant %v beyond the horizon", g.SendAt[i])
					}
					// Anywhere from the earliest it may leave to the
					// tolerance after its instant, a third of the time at
					// one of the two ends.
					from, until := g.From[i], g.SendAt[i].Add(pacedParams.Tolerance)
					at := from.Add(time.Duration(rnd.Int64N(int64(until.Sub(from)) + 1)))
					switch rnd.IntN(6) {
					case 0:
						at = from
					case 1:
						at = until
					}
					if from.Before(g.SendAt[i]) {
						early++
					}
					sends = append(sends, send{at: at, r: batch[i].Requests, t: batch[i].Tokens})
				}
			}
			if n := strictProvider(sends, tc.rpm, tc.tpm); n > 0 {
				t.Errorf("the provider refused %d of %d sends (%d free to leave early)", n, len(sends), early)
			}
			if n := bucketProvider(sends, tc.rpm, tc.tpm); n > 0 {
				t.Errorf("a provider refilling a bucket of a second refused %d of %d sends (%d free to leave early)", n, len(sends), early)
			}
			if tc.idle > 0 && early < len(sends)/10 {
				t.Errorf("%d of %d sends were free to leave early; arrivals at about the limit should find room for more", early, len(sends))
			}
			// Fill over [60 s, 120 s).
			var got int
			for _, s := range sends {
				if d := s.at.Sub(t0); d >= time.Minute && d < 2*time.Minute {
					if tc.binding == "rpm" {
						got += s.r
					} else {
						got += s.t
					}
				}
			}
			limit := tc.rpm
			if tc.binding == "tpm" {
				limit = tc.tpm
			}
			if fill := float64(got) / float64(limit); fill < tc.minFill || fill > 1 {
				t.Errorf("fill of the second minute %.3f, want [%.2f, 1]", fill, tc.minFill)
			} else {
				t.Logf("fill of the second minute %.3f (%d sends in all, %d of them free to leave early)", fill, len(sends), early)
			}
		})
	}
}

// TestPacedSpacing checks pacing itself: sends are spread at the average
// rate rather than bunched at the start of each second, and a request
// larger than the per-second cap gets a window of its own.
func TestPacedSpacing(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	g, err := b.store.Take(ctx, key, budget.Limits{RPM: 150, TPM: 1_000_000}, costs(4, budget.Cost{Requests: 1, Tokens: 10}))
	if err != nil {
		t.Fatal(err)
	}
	if g.N != 4 {
		t.Fatalf("granted %d of 4 within the horizon", g.N)
	}
	for i := 1; i < g.N; i++ {
		if d := g.SendAt[i].Sub(g.SendAt[i-1]); d < 400*time.Millisecond {
			t.Errorf("send %d only %v after the previous; 150 RPM paces every 400 ms", i, d)
		}
	}
	if want := b.clock.Now().Add(pacedParams.Lead); !g.SendAt[0].Equal(want) {
		t.Errorf("first send at %v, want now + lead %v", g.SendAt[0], want)
	}
	if !g.ValidUntil.Equal(g.SendAt[3].Add(pacedParams.Tolerance)) {
		t.Errorf("valid until %v, want the last send + tolerance", g.ValidUntil)
	}

	// 5,000-token jobs against a 2,500-token per-second cap (TPM 150,000;
	// pacing alone would space them 2 s): each alone in 1 s + tolerance.
	b2 := setup(t, pacedParams)
	lim := budget.Limits{RPM: 10_000, TPM: 150_000, BurstTokens: 2500}
	g, err = b2.store.Take(ctx, key, lim, costs(3, budget.Cost{Requests: 1, Tokens: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	// 1,000 tokens pace every 400 ms; two fit a 2,500 cap, the third must
	// wait until the first leaves the window (1 s + tolerance).
	if g.N != 3 {
		t.Fatalf("granted %d of 3", g.N)
	}
	if d := g.SendAt[2].Sub(g.SendAt[0]); d < time.Second+pacedParams.Tolerance {
		t.Errorf("third 1,000-token send %v after the first; the 2,500 cap needs >= 1s + tolerance", d)
	}
}

// TestPacedReturnAt gives back an unused placement: the minute and the
// window see it gone.
func TestPacedReturnAt(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	lim := budget.Limits{RPM: 600, TPM: 1_000_000}
	g, err := b.store.Take(ctx, key, lim, costs(1, budget.Cost{Requests: 1, Tokens: 500}))
	if err != nil || g.N != 1 {
		t.Fatalf("take: %v, %d", err, g.N)
	}
	if err := b.store.ReturnAt(ctx, key, g.SendAt[0], budget.Cost{Requests: 1, Tokens: 500}); err != nil {
		t.Fatal(err)
	}
	used, err := b.store.Used(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if used != (budget.Cost{}) {
		t.Errorf("after the return the window holds %+v, want nothing", used)
	}
}

// A lapsed instant given back after its placement left the schedule (the
// executor woke more than a short window late) still frees the pace when it
// was the newest placement: on a model allowed one request a minute, the
// job's next plan is now, not a minute on.
func TestReturnLapsedAfterPrune(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	lim := budget.Limits{RPM: 1, TPM: 1_000_000}
	c := budget.Cost{Requests: 1, Tokens: 50}
	g, err := b.store.Take(ctx, key, lim, costs(1, c))
	if err != nil || g.N != 1 {
		t.Fatalf("take: %v, %d", err, g.N)
	}
	b.clock.Advance(3 * time.Second)
	// Another model's write on the key prunes old placements first.
	if _, err := b.store.Used(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := b.store.ReturnLapsed(ctx, key, g.SendAt[0], c); err != nil {
		t.Fatal(err)
	}
	g2, err := b.store.Take(ctx, key, lim, costs(1, c))
	if err != nil || g2.N != 1 {
		t.Fatalf("take after the give-back: %v, %d (reason %q, retry at %v): the lapsed instant kept its pace", err, g2.N, g2.Reason, g2.RetryAt)
	}
	if wait := g2.SendAt[0].Sub(b.clock.Now()); wait > time.Second {
		t.Errorf("the next instant is %v away, want now", wait)
	}
}

// TestRoomLeavesAtOnce: on a model far from its limits a call may leave
// as soon as it is planned (Grant.From is the planning moment), not a
// lead later; once the schedule is busy, a call waits for its instant.
func TestRoomLeavesAtOnce(t *testing.T) {
	t.Parallel()
	p := pacedParams
	p.Lead = 200 * time.Millisecond
	b := setup(t, p)
	ctx := context.Background()
	now := b.clock.Now()
	lim := budget.Limits{RPM: 6000, TPM: 1_000_000}
	g, err := b.store.Take(ctx, key, lim, []budget.Cost{{Requests: 1, Tokens: 100}})
	if err != nil || g.N != 1 || len(g.From) != 1 {
		t.Fatalf("first call: %+v %v", g, err)
	}
	if !g.SendAt[0].After(now) || !g.From[0].Equal(now) {
		t.Errorf("first call of an idle model: instant %v, from %v after planning; want the instant a lead on and from at once",
			g.SendAt[0].Sub(now), g.From[0].Sub(now))
	}
	// A backlog: 6,000 a minute pace every 10 ms, and the per-second cap
	// of 100 fills; the later calls must wait for their instants.
	g, err = b.store.Take(ctx, key, lim, costs(150, budget.Cost{Requests: 1, Tokens: 100}))
	if err != nil || g.N == 0 {
		t.Fatalf("backlog: %+v %v", g, err)
	}
	last := g.N - 1
	if g.From[last].Before(g.SendAt[last]) {
		t.Errorf("call %d of a busy schedule may leave %v before its instant; want at its instant", last, g.SendAt[last].Sub(g.From[last]))
	}
}

// A call its minute limit's pace puts beyond the horizon waits for that
// limit, and says so: on a model allowed 2 requests a minute the second
// waits 30 s for "rpm", not for the per-second cap ("burst"), which is
// what `sluice queue` and GET /v1/jobs/{id} show.
func TestPacedBeyondHorizonNamesTheLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	for _, c := range []struct {
		lim  budget.Limits
		cost budget.Cost
		want string
	}{
		{budget.Limits{RPM: 2, TPM: 1_000_000}, budget.Cost{Requests: 1, Tokens: 10}, "rpm"},
		{budget.Limits{RPM: 10_000, TPM: 1_000}, budget.Cost{Requests: 1, Tokens: 400}, "tpm"},
	} {
		k := fmt.Sprintf("%s-%d-%d", key, c.lim.RPM, c.lim.TPM)
		if g, err := b.store.Take(ctx, k, c.lim, []budget.Cost{c.cost}); err != nil || g.N != 1 {
			t.Fatalf("%+v: first call: %+v %v", c.lim, g, err)
		}
		g, err := b.store.Take(ctx, k, c.lim, []budget.Cost{c.cost})
		if err != nil || g.N != 0 {
			t.Fatalf("%+v: second call: %+v %v, want it refused", c.lim, g, err)
		}
		if g.Reason != c.want {
			t.Errorf("%+v: second call refused for %q, want %q", c.lim, g.Reason, c.want)
		}
	}
}

// TestMinuteFill has a backlog of jobs of 4,900-6,300 tokens (the bench's
// tokens-high as the provider counts them) placed against 200,000 TPM,
// about 35.7 a minute by the pace, 35 by the minute, whose trailing 60 s
// then decides most instants. The strict and the bucket providers refuse
// nothing, and the trailing 60 s of whole seconds, as a provider's ledger
// counts them, stays full: 97.4 % on average over these runs when the pace
// ran from the instant the minute imposed and a slice left the minute at
// its end (98.1 % with both fixed: TestMinuteWait).
func TestMinuteFill(t *testing.T) {
	if testing.Short() {
		t.Skip("21 simulated minutes, about 2 s: the full tier runs it, not -short")
	}
	t.Parallel()
	const rpm, tpm = 10_000, 200_000
	var sum float64
	n := 0
	for seed := range uint64(3) {
		b := setup(t, pacedParams)
		rnd := rand.New(rand.NewPCG(seed+1, 2))
		var sends []send
		var head []budget.Cost
		// 7 minutes of 50-ms steps; each asks for the head of the queue.
		for range 7 * 60 * 20 {
			b.clock.Advance(50 * time.Millisecond)
			for len(head) < 4 {
				head = append(head, budget.Cost{Requests: 1, Tokens: 4900 + rnd.IntN(1400)})
			}
			g, err := b.store.Take(context.Background(), key, budget.Limits{RPM: rpm, TPM: tpm}, head)
			if err != nil {
				t.Fatal(err)
			}
			for i := range g.N {
				sends = append(sends, send{at: g.SendAt[i], r: 1, t: head[i].Tokens})
			}
			head = head[g.N:]
		}
		if n := strictProvider(sends, rpm, tpm); n > 0 {
			t.Errorf("the provider refused %d of %d sends", n, len(sends))
		}
		if n := bucketProvider(sends, rpm, tpm); n > 0 {
			t.Errorf("a provider refilling a bucket of a second refused %d of %d sends", n, len(sends))
		}
		var secs [7 * 60]int
		for _, s := range sends {
			if i := int(s.at.Sub(t0) / time.Second); i < len(secs) {
				secs[i] += s.t
			}
		}
		// Windows ending from the second minute to the sixth.
		for end := 120; end < 6*60; end++ {
			w := 0
			for _, x := range secs[end-59 : end+1] {
				w += x
			}
			sum += float64(w) / tpm
			n++
		}
	}
	if fill := sum / float64(n); fill < 0.978 {
		t.Errorf("mean trailing-60-s fill %.4f, want at least 0.978", fill)
	} else {
		t.Logf("mean trailing-60-s fill %.4f", fill)
	}
}

// TestMinuteWait checks the two instants TestMinuteFill depends on. A job
// that must wait for the minute waits until the last placement of the
// slice it waits for leaves it, not until the slice ends (up to a slice,
// 0.4 % of the minute, lost each time the minute binds). And it keeps up
// to a short window of its place on the pace, as a job the short window
// made wait does (record): the next job is paced from there, not from the
// later instant, or each wait for the minute is lost again to the pace.
func TestMinuteWait(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	lim := budget.Limits{RPM: 10_000, TPM: 200_000} // 300 µs a token; a cap of 3,334 a second
	take := func(tokens int) time.Time {
		t.Helper()
		g, err := b.store.Take(ctx, key, lim, []budget.Cost{{Requests: 1, Tokens: tokens}})
		if err != nil || g.N != 1 {
			t.Fatalf("take %d tokens at %v: %v, %d granted (%s, retry at %v)", tokens, b.clock.Now().Sub(t0), err, g.N, g.Reason, g.RetryAt.Sub(t0))
		}
		return g.SendAt[0]
	}
	first := take(190_000) // paces the next 57 s on
	b.clock.Set(first.Add(59 * time.Second))
	// 12,000 more do not fit the minute until the first leaves it.
	edge := take(12_000)
	if want := first.Add(time.Minute + pacedParams.Tolerance); !edge.Equal(want) {
		t.Errorf("second send %v after the first, want the minute and the tolerance: %v", edge.Sub(first), want.Sub(first))
	}
	// The minute made it wait past its pace by more than a second: the
	// pace runs on from a second before its instant (3.6 s for 12,000
	// tokens), not from the instant (3.6 s later still).
	b.clock.Set(edge.Add(time.Second))
	if got, want := take(3_000), edge.Add(2600*time.Millisecond); !got.Equal(want) {
		t.Errorf("third send %v after the second, want %v", got.Sub(edge), want.Sub(edge))
	}
}

// TestMinuteEdgeUnknown: a slice charged at an instant the window does not
// know (the provider reported less room: Store.Charge) leaves the minute
// only when the slice ends; the latest placements survive the stored form.
func TestMinuteEdgeUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t, pacedParams)
	ctx := context.Background()
	lim := budget.Limits{RPM: 10_000, TPM: 200_000}
	g, err := b.store.Take(ctx, key, lim, []budget.Cost{{Requests: 1, Tokens: 190_000}})
	if err != nil || g.N != 1 {
		t.Fatalf("take: %v, %d", err, g.N)
	}
	b.clock.Advance(100 * time.Millisecond) // in the first placement's slice
	if err := b.store.Charge(ctx, key, budget.Cost{Tokens: 1}); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(g.SendAt[0].Add(59 * time.Second))
	g2, err := b.store.Take(ctx, key, lim, []budget.Cost{{Requests: 1, Tokens: 12_000}})
	if err != nil || g2.N != 1 {
		t.Fatalf("take: %v, %d", err, g2.N)
	}
	if want := t0.Add(pacedParams.Slice + time.Minute + pacedParams.Tolerance); !g2.SendAt[0].Equal(want) {
		t.Errorf("second send at %v, want the charged slice's end + the minute + the tolerance: %v", g2.SendAt[0].Sub(t0), want.Sub(t0))
	}
	w := budget.Window{Slices: map[int64]budget.Vec{7: {1, 5000}}, Ends: map[int64]int64{7: 120}}
	data, _ := w.MarshalJSON()
	var back budget.Window
	if err := json.Unmarshal(data, &back); err != nil || back.Ends[7] != 120 || len(back.Ends) != 1 {
		t.Errorf("round trip %s: %v %v", data, back.Ends, err)
	}
}
