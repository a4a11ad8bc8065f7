package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// The fairness benchmarks run Sluice in-process against a TPM-bound
// simulator and measure, per job, the queue wait from submission to the
// provider receiving the call. Run them with
//
//	go test -run XXX -bench Fair -benchtime 1x -timeout 30m ./cmd/sluice/
//
// Each takes one to three minutes: limits are real per-minute windows.

// arrivals records when the provider first saw each job.
type arrivals struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (a *arrivals) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Sluice-Job-Id")
		a.mu.Lock()
		if _, ok := a.at[id]; !ok {
			a.at[id] = time.Now()
		}
		a.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

type fairRun struct {
	sim      *sim.Server
	arr      *arrivals
	n        systest.Node
	submitAt sync.Map // job id -> time
	tenantOf sync.Map // job id -> tenant
	costOf   sync.Map // job id -> tokens
	queued   sync.Map // job id -> when it was seen entering QUEUE (ingest done)
	sent     sync.Map // job id -> when it was seen on DISPATCH (admission done)
}

// watch records when each job passes QUEUE and DISPATCH, to split a queue
// wait into ingest, admission and executor.
func (fr *fairRun) watch(b *testing.B, nc *nats.Conn) {
	for prefix, m := range map[string]*sync.Map{job.QueuePrefix: &fr.queued, job.DispatchPrefix: &fr.sent} {
		sub, err := nc.Subscribe(prefix+">", func(msg *nats.Msg) {
			at := time.Now()
			var j struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(msg.Data, &j) == nil {
				m.LoadOrStore(j.ID, at)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
}

// stages returns a tenant's p50 and p95 time in ingest (submission to
// QUEUE), admission (QUEUE to DISPATCH) and executor (DISPATCH to provider).
func (fr *fairRun) stages(tenant string) string {
	var ing, adm, exe []time.Duration
	fr.arr.mu.Lock()
	defer fr.arr.mu.Unlock()
	fr.submitAt.Range(func(k, v any) bool {
		if t, _ := fr.tenantOf.Load(k); t != tenant {
			return true
		}
		q, ok1 := fr.queued.Load(k)
		d, ok2 := fr.sent.Load(k)
		at, ok3 := fr.arr.at[k.(string)]
		if ok1 && ok2 && ok3 {
			ing = append(ing, q.(time.Time).Sub(v.(time.Time)))
			adm = append(adm, d.(time.Time).Sub(q.(time.Time)))
			exe = append(exe, at.Sub(d.(time.Time)))
		}
		return true
	})
	pct := func(ws []time.Duration) string {
		if len(ws) == 0 {
			return "-"
		}
		sort.Slice(ws, func(i, k int) bool { return ws[i] < ws[k] })
		return fmt.Sprintf("%s/%s", ws[len(ws)/2].Round(100*time.Microsecond), ws[len(ws)*95/100].Round(100*time.Microsecond))
	}
	return fmt.Sprintf("ingest %s, admission %s, executor %s (p50/p95)", pct(ing), pct(adm), pct(exe))
}

func startFair(b *testing.B, tpm int, tenants string) *fairRun {
	return startFairPaced(b, tpm, tenants, "burst_fraction: 0.02")
}

// startFairPaced adds admission settings, such as burst_fraction: how much
// of a minute's budget may go out in one second (0.02, the default, paces
// it at 1.2x; 0.04 front-loads it; 1/60 paces it exactly).
func startFairPaced(b *testing.B, tpm int, tenants string, admission string) *fairRun {
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", TPM: tpm}}, TTFT: 50 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	fr := &fairRun{sim: s, arr: &arrivals{at: map[string]time.Time{}}}
	ts := httptest.NewServer(fr.arr.wrap(s))
	b.Cleanup(ts.Close)
	fr.n = systest.Start(b, fmt.Sprintf(`
server: {open: true}
admission: {slice: 100ms, %s}
providers:
  - name: sim
    base_url: %s/v1
    models: [{name: gpt-4o-mini, tpm: %d, max_concurrency: 256}]
tenants:
%s`, admission, ts.URL, tpm, tenants), systest.Env)
	return fr
}

func (fr *fairRun) submit(ctx context.Context, b *testing.B, c interface {
	Submit(context.Context, *job.Job) (string, error)
}, tenant string, p job.Priority, words, maxTokens int) {
	j := &job.Job{ID: job.NewID(), Tenant: tenant, Priority: p, Request: systest.ChatBody("gpt-4o-mini", words, maxTokens)}
	fr.submitAt.Store(j.ID, time.Now())
	fr.tenantOf.Store(j.ID, tenant)
	fr.costOf.Store(j.ID, words+10+maxTokens)
	if _, err := c.Submit(ctx, j); err != nil {
		b.Fatal(err)
	}
}

// waits returns the queue waits of a tenant's jobs (ones that reached the
// provider), and the p50/p95.
func (fr *fairRun) waits(tenant string) (p50, p95 time.Duration, n int) {
	var ws []time.Duration
	fr.arr.mu.Lock()
	defer fr.arr.mu.Unlock()
	fr.submitAt.Range(func(k, v any) bool {
		if t, _ := fr.tenantOf.Load(k); t != tenant {
			return true
		}
		if at, ok := fr.arr.at[k.(string)]; ok {
			ws = append(ws, at.Sub(v.(time.Time)))
		}
		return true
	})
	if len(ws) == 0 {
		return 0, 0, 0
	}
	sort.Slice(ws, func(i, k int) bool { return ws[i] < ws[k] })
	return ws[len(ws)/2], ws[len(ws)*95/100], len(ws)
}

// shares returns each tenant's tokens that reached the provider between
// from and to.
func (fr *fairRun) shares(from, to time.Time) map[string]float64 {
	out := map[string]float64{}
	fr.arr.mu.Lock()
	defer fr.arr.mu.Unlock()
	for id, at := range fr.arr.at {
		if at.Before(from) || at.After(to) {
			continue
		}
		t, _ := fr.tenantOf.Load(id)
		c, _ := fr.costOf.Load(id)
		if t != nil && c != nil {
			out[t.(string)] += float64(c.(int))
		}
	}
	return out
}

func (fr *fairRun) waitAll(ctx context.Context, b *testing.B, total int) {
	arrived := func() int { fr.arr.mu.Lock(); defer fr.arr.mu.Unlock(); return len(fr.arr.at) }
	if !natstest.Poll(ctx, func() bool { return arrived() >= total }) {
		b.Fatalf("only %d of %d jobs reached the provider", arrived(), total)
	}
}

// arrivedAfter reports whether a request reached the provider after t:
// every request of a window ending at t has arrived by then.
func (fr *fairRun) arrivedAfter(t time.Time) bool {
	fr.arr.mu.Lock()
	defer fr.arr.mu.Unlock()
	for _, at := range fr.arr.at {
		if at.After(t) {
			return true
		}
	}
	return false
}

func jainIndex(xs ...float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// BenchmarkFairNoisyNeighbour: tenant A submits 2,000 batch jobs at once,
// tenant B 50 jobs spread over 50 s; equal weights; the TPM limit binds.
// Reports B's p95 queue wait with A and alone.
func BenchmarkFairNoisyNeighbour(b *testing.B) {
	b.Run("default", func(b *testing.B) { noisyNeighbour(b, "burst_fraction: 0.02") })
	b.Run("paced", func(b *testing.B) { noisyNeighbour(b, "burst_fraction: 0.0175") })
	// Front-loaded pacing fills the minute in 25 s, and nothing frees for
	// the next 35 s: the headroom must hold B's demand for that long.
	b.Run("front-loaded", func(b *testing.B) { noisyNeighbour(b, "burst_fraction: 0.04") })
	b.Run("front-loaded-headroom-5pc", func(b *testing.B) { noisyNeighbour(b, "burst_fraction: 0.04, headroom: 0.05") })
}

func noisyNeighbour(b *testing.B, admission string) {
	const tpm = 240_000 // A's backlog needs about 2.5 minutes of budget
	run := func(withA bool) (p50, p95 time.Duration) {
		fr := startFairPaced(b, tpm, "  - {name: a}\n  - {name: b}\n", admission)
		nc, cl := fr.n.Connect(b)
		fr.watch(b, nc)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		total := 50
		if withA {
			for range 2000 {
				fr.submit(ctx, b, cl, "a", job.Batch, 200, 100)
			}
			total += 2000
		}
		start := time.Now()
		for i := range 50 {
			natstest.Pace(ctx, start, i, time.Second)
			fr.submit(ctx, b, cl, "b", job.Batch, 200, 100)
		}
		wctx, stop := context.WithTimeout(ctx, 31*time.Second)
		natstest.Poll(wctx, func() bool { _, _, n := fr.waits("b"); return n >= 50 })
		stop()
		p50, p95, _ = fr.waits("b")
		ms := fr.sim.Stats().Models["gpt-4o-mini"]
		b.Logf("tenant B (with A: %v): %s; busiest 60 s at the provider: %d of %d tokens, %d answered 429",
			withA, fr.stages("b"), ms.MaxTokensIn60s, tpm, ms.RateLimited)
		return p50, p95
	}
	for range b.N {
		a50, a95 := run(false)
		w50, w95 := run(true)
		b.ReportMetric(a95.Seconds(), "B-p95-alone-s")
		b.ReportMetric(w95.Seconds(), "B-p95-with-A-s")
		b.Logf("tenant B queue wait alone: p50 %s p95 %s; with A's 2,000-job backlog: p50 %s p95 %s (%.1fx)",
			a50.Round(time.Millisecond), a95.Round(time.Millisecond), w50.Round(time.Millisecond), w95.Round(time.Millisecond), float64(w95)/float64(max(a95, time.Millisecond)))
	}
}

// BenchmarkFairShares: tenants with weights 1 and 2 both flood; reports
// each one's share of the tokens while both are backlogged, and Jain's
// index of the weight-normalised shares.
func BenchmarkFairShares(b *testing.B) {
	const tpm = 180_000
	for range b.N {
		fr := startFair(b, tpm, "  - {name: a, weight: 1}\n  - {name: b, weight: 2}\n")
		_, cl := fr.n.Connect(b)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		start := time.Now()
		for range 1200 {
			// Mixed sizes: a sends large requests, b small ones.
			fr.submit(ctx, b, cl, "a", job.Batch, 700, 300)
			fr.submit(ctx, b, cl, "b", job.Batch, 150, 50)
			fr.submit(ctx, b, cl, "b", job.Batch, 150, 50)
		}
		// Both stay backlogged for the first 90 s: measured once a request
		// has arrived after them (or at 120 s).
		wctx, stop := context.WithDeadline(ctx, start.Add(120*time.Second))
		natstest.Poll(wctx, func() bool { return fr.arrivedAfter(start.Add(90 * time.Second)) })
		stop()
		sh := fr.shares(start, start.Add(90*time.Second))
		total := sh["a"] + sh["b"]
		b.ReportMetric(sh["a"]/total, "share-a")
		b.ReportMetric(sh["b"]/total, "share-b")
		j := jainIndex(sh["a"]/1, sh["b"]/2)
		b.ReportMetric(j, "jain")
		b.Logf("tokens while both backlogged (90 s): a (weight 1) %.0f = %.1f%%, b (weight 2) %.0f = %.1f%% (weight shares 33.3%% / 66.7%%); Jain's index of weighted shares %.4f",
			sh["a"], 100*sh["a"]/total, sh["b"], 100*sh["b"]/total, j)
		cancel()
	}
}

// BenchmarkFairPriority: batch saturates the quota; interactive jobs arrive
// one a second. Reports interactive p95 queue wait and batch's share.
func BenchmarkFairPriority(b *testing.B) {
	const tpm = 240_000
	for range b.N {
		fr := startFair(b, tpm, "  - {name: bulk}\n  - {name: app}\n")
		_, cl := fr.n.Connect(b)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		start := time.Now()
		for range 3000 {
			fr.submit(ctx, b, cl, "bulk", job.Batch, 200, 100)
		}
		appStart := time.Now()
		for i := range 60 {
			natstest.Pace(ctx, appStart, i, time.Second)
			fr.submit(ctx, b, cl, "app", job.Interactive, 200, 100)
		}
		// Until every interactive job has reached the provider (or 30 s).
		wctx, stop := context.WithTimeout(ctx, 30*time.Second)
		natstest.Poll(wctx, func() bool { _, _, n := fr.waits("app"); return n >= 60 })
		stop()
		p50, p95, n := fr.waits("app")
		sh := fr.shares(start, start.Add(60*time.Second))
		b.ReportMetric(p95.Seconds(), "interactive-p95-s")
		b.ReportMetric(sh["bulk"]/(sh["bulk"]+sh["app"]), "batch-share")
		b.Logf("interactive (%d jobs) queue wait p50 %s p95 %s while batch saturates; batch kept %.1f%% of the tokens (floor 5%%)",
			n, p50.Round(time.Millisecond), p95.Round(time.Millisecond), 100*sh["bulk"]/(sh["bulk"]+sh["app"]))
		cancel()
	}
}

// BenchmarkFairNoStarvation: one tenant sends 200-token requests, another
// 5,000-token ones, both backlogged; reports both p95 waits.
func BenchmarkFairNoStarvation(b *testing.B) {
	b.Run("default", func(b *testing.B) { noStarvation(b, "burst_fraction: 0.02") })
	// What the headroom costs when the new flows it is for are rare.
	b.Run("headroom-off", func(b *testing.B) { noStarvation(b, "burst_fraction: 0.02, headroom: 0") })
}

func noStarvation(b *testing.B, admission string) {
	const tpm = 300_000
	for range b.N {
		fr := startFairPaced(b, tpm, "  - {name: small}\n  - {name: large}\n", admission)
		_, cl := fr.n.Connect(b)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		// Offered over 60 s at about twice the limit, half the tokens each.
		start := time.Now()
		for s := range 60 {
			natstest.Pace(ctx, start, s, time.Second)
			for range 25 {
				fr.submit(ctx, b, cl, "small", job.Standard, 150, 50)
			}
			fr.submit(ctx, b, cl, "large", job.Standard, 4000, 1000)
		}
		fr.waitAll(ctx, b, 60*26)
		ms := fr.sim.Stats().Models["gpt-4o-mini"]
		b.Logf("%d requests; busiest 60 s at the provider: %d of %d tokens, %d answered 429", ms.Admitted, ms.MaxTokensIn60s, tpm, ms.RateLimited)
		s50, s95, _ := fr.waits("small")
		l50, l95, _ := fr.waits("large")
		b.ReportMetric(s95.Seconds(), "short-p95-s")
		b.ReportMetric(l95.Seconds(), "long-p95-s")
		b.Logf("queue wait p50/p95: 200-token requests %s / %s, 5,000-token requests %s / %s (%.2fx)",
			s50.Round(time.Millisecond), s95.Round(time.Millisecond), l50.Round(time.Millisecond), l95.Round(time.Millisecond), float64(l95)/float64(max(s95, time.Millisecond)))
		cancel()
	}
}
