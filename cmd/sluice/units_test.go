package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestUnitsEndToEnd: a model limited on a third unit (600 images a minute,
// so 10 a second; RPM and TPM generous, so only images bind) gets 60 jobs
// of 1-2 images through the whole mesh, over NATS (the envelope's "cost")
// and HTTP (X-Sluice-Cost). Every job succeeds on its first attempt, the
// simulator never accepts more images than the limit in any trailing minute
// or second, and a 429 is allowed only where a call in its window reached
// the simulator later than send_tolerance after its planned instant
// (systest.JudgeArrivals): on a starved machine the simulator's handler has
// run up to 137 ms after the request was written, a call planned within the
// quantum then shares the second of the calls after it, and its 429 costs
// no attempt. BenchmarkUnitsEndToEnd holds the same run to no 429 at all. A
// job naming a unit the model does not limit is refused naming it.
func TestUnitsEndToEnd(t *testing.T) {
	t.Parallel()
	r := unitsEndToEnd(t)
	systest.JudgeArrivals(t, r.seen.All(), r.plans, r.tolerance, r.ms.RateLimited)
}

// BenchmarkUnitsEndToEnd is TestUnitsEndToEnd's run held to the strict
// claim: the simulator answers no 429, which needs every call to reach it
// within send_tolerance of its instant (a quiet machine).
func BenchmarkUnitsEndToEnd(b *testing.B) {
	for range b.N {
		r := unitsEndToEnd(b)
		if got := r.ms.RateLimited; got != 0 {
			b.Errorf("the simulator answered %d 429s, want none", got)
		}
		b.ReportMetric(float64(r.ms.RateLimited), "429s")
	}
}

// unitsRun is what unitsEndToEnd leaves to judge.
type unitsRun struct {
	ms        sim.ModelStats
	seen      *systest.Judged
	plans     *systest.Plans
	tolerance time.Duration
}

// unitsEndToEnd runs TestUnitsEndToEnd's workload and checks what holds
// however late calls reach the simulator: every job succeeds on its first
// attempt (a 429 costs none), the images charged are the jobs', and the
// simulator's accepted ledger stays within the limit and the quantum.
func unitsEndToEnd(tb testing.TB) unitsRun {
	const (
		model  = "painter"
		images = 600 // a minute: a quantum of 10 a second
		jobs   = 60  // 90 images: about 9 seconds of the quantum
	)
	r := unitsRun{seen: &systest.Judged{}, tolerance: 15 * time.Millisecond}
	simSrv, simURL := systest.StartSim(tb, sim.Config{
		Models:    []sim.ModelLimits{{Name: model, RPM: 100_000, TPM: 100_000_000, Units: map[string]int{"images": images}}},
		TTFT:      10 * time.Millisecond,
		APIKeys:   []string{"sim-secret"},
		OnArrival: r.seen.Add,
	})
	cfg := strings.Replace(systest.SimConfig(simURL, model, 100_000, 100_000_000, fmt.Sprintf("admission:\n  send_tolerance: %s\n", r.tolerance)),
		"max_concurrency: 128}", fmt.Sprintf("max_concurrency: 128, units: {images: %d}, allow_fields: [sim_units]}", images), 1)
	n := systest.Start(tb, cfg, systest.Env)
	nc, cl := n.Connect(tb)
	r.plans = systest.WatchPlans(tb, nc)

	var mu sync.Mutex
	results := map[string]job.Result{}
	sub, err := nc.Subscribe(job.ResultPrefix+">", func(m *nats.Msg) {
		var r job.Result
		if err := json.Unmarshal(m.Data, &r); err != nil {
			tb.Errorf("bad result: %v", err)
			return
		}
		mu.Lock()
		results[r.JobID] = r
		mu.Unlock()
	})
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The simulator reads a request's images from its body ("sim_units", a
	// provider's own field: the model's allow_fields lets it through);
	// Sluice from the job's cost. Both say the same.
	body := func(i, k int) []byte {
		b := systest.ChatBody(model, 10+i%20, 32)
		return append(b[:len(b)-1], fmt.Sprintf(`,"sim_units":{"images":%d}}`, k)...)
	}
	var ids sync.Map
	var wg sync.WaitGroup
	errs := make(chan error, jobs)
	want := 0
	for i := range jobs {
		k := 1 + i%2
		want += k
		switch {
		case i%10 == 9:
			// A chat completion over HTTP, its cost in X-Sluice-Cost.
			wg.Add(1)
			go func() {
				defer wg.Done()
				id, err := chatWithCost(ctx, n.HTTP, "globex-key", body(i, k), fmt.Sprintf("images=%d", k))
				if err != nil {
					errs <- err
					return
				}
				ids.Store(id, k)
			}()
		default:
			id, err := cl.Submit(ctx, &job.Job{Tenant: []string{"acme", "initech"}[i%2], Request: body(i, k), Cost: map[string]int{"images": k}})
			if err != nil {
				tb.Fatalf("submit #%d: %v", i, err)
			}
			ids.Store(id, k)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatalf("chat completion: %v", err)
	}

	finished := func() int {
		mu.Lock()
		defer mu.Unlock()
		done := 0
		ids.Range(func(id, _ any) bool {
			if _, ok := results[id.(string)]; ok {
				done++
			}
			return true
		})
		return done
	}
	if !natstest.Poll(ctx, func() bool { return finished() == jobs }) {
		tb.Fatalf("only %d of %d jobs finished", finished(), jobs)
	}
	mu.Lock()
	ids.Range(func(id, _ any) bool {
		if res := results[id.(string)]; res.Status != job.StatusSucceeded || res.Attempts != 1 {
			tb.Errorf("job %s ended %s after %d attempts, want succeeded after 1", id, res.Status, res.Attempts)
		}
		return true
	})
	mu.Unlock()

	st := simSrv.Stats()
	r.ms = st.Models[model]
	u := r.ms.Units["images"]
	tb.Logf("images: %+v; requests %v", u, r.ms.Requests)
	if u.Charged != int64(want) {
		tb.Errorf("the simulator charged %d images, want the %d the jobs stated", u.Charged, want)
	}
	if u.MaxAdmittedIn60s > images || u.MaxAdmittedIn1s > images/60 {
		tb.Errorf("the simulator accepted %d images in a minute and %d in a second, limit %d, quantum %d", u.MaxAdmittedIn60s, u.MaxAdmittedIn1s, images, images/60)
	}
	if r.ms.MaxAdmittedRequestsIn1s > r.ms.BurstRequests || r.ms.MaxTokensIn1s > r.ms.BurstTokens {
		tb.Errorf("requests or tokens over their quantum: %d/%d requests, %d/%d tokens in a second",
			r.ms.MaxAdmittedRequestsIn1s, r.ms.BurstRequests, r.ms.MaxTokensIn1s, r.ms.BurstTokens)
	}

	// A unit the model does not limit is refused, naming it.
	code, msg := chatStatus(ctx, n.HTTP, "acme-key", systest.ChatBody(model, 5, 8), "videos=1")
	if code != http.StatusBadRequest || !strings.Contains(msg, `does not limit unit \"videos\"`) {
		tb.Errorf("X-Sluice-Cost naming videos: HTTP %d %s; want 400 naming the unit", code, msg)
	}
	return r
}

// chatWithCost posts a chat completion with X-Sluice-Cost and returns its
// job id once it succeeded.
func chatWithCost(ctx context.Context, base, key string, body []byte, cost string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sluice-Cost", cost)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("chat completions: HTTP %d %s", resp.StatusCode, b)
	}
	return resp.Header.Get("X-Sluice-Job-Id"), nil
}

// chatStatus posts a chat completion with X-Sluice-Cost and returns the
// status and body of the answer.
func chatStatus(ctx context.Context, base, key string, body []byte, cost string) (int, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Sluice-Cost", cost)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
