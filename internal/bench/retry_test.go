package bench

import (
	"math/rand/v2"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// setupSim serves a simulator for one test.
func setupSim(t *testing.T, cfg sim.Config) (*sim.Server, *caller) {
	t.Helper()
	s, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	hc := newHTTPClient(16)
	t.Cleanup(func() {
		hc.CloseIdleConnections()
		ts.Close()
	})
	return s, &caller{hc: hc, url: ts.URL + "/v1/chat/completions", policy: RetryPolicy{MaxAttempts: 8, Base: 20 * time.Millisecond, Max: 200 * time.Millisecond}}
}

func shortJob(t *testing.T, seed uint64) Job {
	t.Helper()
	j, err := newJob(rand.New(rand.NewPCG(seed, 1)), 30, 20)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func TestRetryLoopRecoversFromBurst429s(t *testing.T) {
	t.Parallel()
	// 60 RPM with a per-second cap of 6 requests (pinned: the default is
	// 1), so 10 at once draw 429s whose Retry-After is under a second.
	s, c := setupSim(t, sim.Config{Models: []sim.ModelLimits{{Name: Model, RPM: 60}}, BurstFraction: 0.1})
	var wg sync.WaitGroup
	oks := make([]bool, 10)
	for i := range oks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			oks[i], _ = c.do(t.Context(), shortJob(t, uint64(i)), rand.New(rand.NewPCG(uint64(i), 2)))
		}()
	}
	wg.Wait()
	for i, ok := range oks {
		if !ok {
			t.Errorf("job %d failed", i)
		}
	}
	ms := s.Stats().Models[Model]
	if ms.SuccessRequests != 10 || ms.RateLimited == 0 {
		t.Errorf("provider saw %d successes and %d 429s, want 10 and some", ms.SuccessRequests, ms.RateLimited)
	}
	if ms.MaxAdmittedRequestsIn1s > 6 {
		t.Errorf("provider admitted %d in one second, above its cap 6", ms.MaxAdmittedRequestsIn1s)
	}
}

func TestRetryLoopStopsAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	s, c := setupSim(t, sim.Config{Models: []sim.ModelLimits{{Name: Model}}, Faults: sim.Faults{Rate503: 1}})
	ok, attempts := c.do(t.Context(), shortJob(t, 1), rand.New(rand.NewPCG(1, 2)))
	if ok || attempts != 8 {
		t.Errorf("always-503 job: ok %v after %d attempts, want failure after 8", ok, attempts)
	}
	if got := s.Stats().Requests[503]; got != 8 {
		t.Errorf("provider answered 503 %d times, want 8", got)
	}
}

func TestRetryLoopDoesNotRetryBadRequests(t *testing.T) {
	t.Parallel()
	s, c := setupSim(t, sim.Config{Models: []sim.ModelLimits{{Name: Model}}})
	bad := Job{Body: []byte(`{"model":"` + Model + `","max_tokens":-5,"messages":[{"role":"user","content":"hi"}]}`)}
	ok, attempts := c.do(t.Context(), bad, rand.New(rand.NewPCG(1, 2)))
	if ok || attempts != 1 {
		t.Errorf("bad request: ok %v after %d attempts, want failure after 1", ok, attempts)
	}
	if got := s.Stats().Requests[400]; got != 1 {
		t.Errorf("provider answered 400 %d times, want 1", got)
	}
}

func TestTokenShapingRefundsUnusedOutput(t *testing.T) {
	t.Parallel()
	// Counting as Sluice estimates, so the completion is the success's
	// tokens less the job's prompt.
	s, c := setupSim(t, sim.Config{Models: []sim.ModelLimits{{Name: Model, TPM: 60_000}}, Count: sim.TokenCount{Mode: sim.CountSluice}})
	c.limiter, c.settle = NewLimiter(0, 60_000), true // capacity 1,000 tokens
	at := time.Now()
	c.limiter.now = func() time.Time { return at } // no refill during the test
	j := shortJob(t, 7)
	if ok, _ := c.do(t.Context(), j, rand.New(rand.NewPCG(1, 2))); !ok {
		t.Fatal("job failed")
	}
	ms := s.Stats().Models[Model]
	completion := int(ms.SuccessTokens) - j.Prompt
	want := 1000 - float64(j.Cost()) + float64(j.MaxTokens-completion)
	if got := c.limiter.tokens.Level(at); got != want {
		t.Errorf("token level after one job = %v, want %v (capacity - cost + unused output %d)", got, want, j.MaxTokens-completion)
	}
}
