package sim_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/fakeclock"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// slowBody is a request body whose first read comes late: the clock
// advances by d before it returns, as when the server reads and parses a
// request some time after it arrived.
type slowBody struct {
	r    io.Reader
	clk  *fakeclock.Clock
	d    time.Duration
	read bool
}

func (b *slowBody) Read(p []byte) (int, error) {
	if !b.read {
		b.read = true
		b.clk.Advance(b.d)
	}
	return b.r.Read(p)
}

// TestChargedAtArrival: the limits judge the instant a request arrived,
// not the instant the server got round to reading its body. Under load the
// two were up to 12 ms apart, and a call sent within its tolerance was
// judged late (TestEndToEnd drew a 429 now and then under load).
func TestChargedAtArrival(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 60}}, Now: clk.Now, Count: sluiceCount}) // 1 request a second
	if err != nil {
		t.Fatal(err)
	}
	b := body(model, "hi", 10)
	post := func(r io.Reader) int {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", r))
		return rec.Code
	}
	if code := post(strings.NewReader(b)); code != http.StatusOK {
		t.Fatalf("first request: status %d", code)
	}
	// The second arrives 900 ms later, within the first's second, and is
	// read 200 ms after that, when the first has left the window.
	clk.Advance(900 * time.Millisecond)
	if code := post(&slowBody{r: strings.NewReader(b), clk: clk, d: 200 * time.Millisecond}); code != http.StatusTooManyRequests {
		t.Errorf("a second request arriving 900 ms after the first: status %d, want 429 (judged when its body was read?)", code)
	}
	if ms := s.Stats().Models[model]; ms.MaxRequestsIn1s != 2 {
		t.Errorf("busiest second held %d requests, want 2", ms.MaxRequestsIn1s)
	}
}

// TestOnArrival: the hook sees every judged request with its headers, its
// instant, its charge and what refused it.
func TestOnArrival(t *testing.T) {
	t.Parallel()
	clk := newClock()
	var got []sim.Arrival
	var mu sync.Mutex
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 60}}, Now: clk.Now, Count: sluiceCount, // 1 request a second
		OnArrival: func(a sim.Arrival) { mu.Lock(); got = append(got, a); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	b := body(model, "hi", 10)
	post := func(jobID string) int {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(b))
		r.Header.Set("X-Sluice-Job-Id", jobID)
		r.Header.Set("Idempotency-Key", "op-"+jobID)
		s.ServeHTTP(rec, r)
		return rec.Code
	}
	first := clk.Now()
	if code := post("a"); code != http.StatusOK {
		t.Fatalf("first request: status %d", code)
	}
	clk.Advance(300 * time.Millisecond)
	if code := post("b"); code != http.StatusTooManyRequests {
		t.Fatalf("second request in the same second: status %d, want 429", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("%d arrivals seen, want 2: %+v", len(got), got)
	}
	a, r := got[0], got[1]
	if a.JobID != "a" || a.IdempotencyKey != "op-a" || !a.Admitted || a.Limit != "" || !a.At.Equal(first) || a.Cost != int64(cost(t, b)) || a.Model != model {
		t.Errorf("admitted arrival %+v, want job a at %v costing %d", a, first, cost(t, b))
	}
	if r.JobID != "b" || r.Admitted || r.Limit != "requests_short_window" || !r.At.Equal(first.Add(300*time.Millisecond)) {
		t.Errorf("refused arrival %+v, want job b refused by requests_short_window 300 ms later", r)
	}
}

// TestDayQuota: a model's per-day quotas refuse what the trailing 24 h
// has no room for, in OpenAI's words, with the wait until it has; the
// refusals are counted and reported by the arrival hook, and the quota
// frees as the day passes.
func TestDayQuota(t *testing.T) {
	t.Parallel()
	clk := newClock()
	var limits []string
	var mu sync.Mutex
	b := body(model, "hi", 10)
	c := int64(cost(t, b))
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 1000, TPM: 1_000_000, RPD: 2}, {Name: "tok", TPD: int(3 * c / 2)}}, Now: clk.Now, Count: sluiceCount,
		OnArrival: func(a sim.Arrival) { mu.Lock(); limits = append(limits, a.Limit); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	post := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(b)))
		return rec
	}
	for i := range 2 {
		if r := post(); r.Code != http.StatusOK {
			t.Fatalf("request %d: status %d", i+1, r.Code)
		}
		clk.Advance(time.Hour)
	}
	r := post()
	if r.Code != http.StatusTooManyRequests || !strings.Contains(r.Body.String(), "on requests per day (RPD): Limit 2, Used 2, Requested 1") {
		t.Fatalf("third request in the day: %d %s, want a 429 naming the RPD", r.Code, r.Body)
	}
	// The first request leaves the trailing 24 h 22 h from now.
	if ra := r.Header().Get("Retry-After"); ra != "79200" {
		t.Errorf("Retry-After %q, want 79200 (22 h)", ra)
	}
	clk.Advance(22*time.Hour + time.Minute)
	if r := post(); r.Code != http.StatusOK {
		t.Fatalf("once the first request left the day: status %d %s", r.Code, r.Body)
	}
	// The second and the fourth are in the day now.
	if r := post(); r.Code != http.StatusTooManyRequests {
		t.Fatalf("a third request in 24 h: status %d", r.Code)
	}
	// Tokens: a quota of 1.5 requests' charges refuses the second.
	tb := body("tok", "hi", 10)
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(tb)))
		if rec.Code != want || (want != http.StatusOK && !strings.Contains(rec.Body.String(), "tokens per day (TPD)")) {
			t.Errorf("token-quota request %d: %d %s, want %d", i+1, rec.Code, rec.Body, want)
		}
	}
	if by := s.Stats().Models["tok"].RateLimitedBy; by["tokens_per_day"] != 1 {
		t.Errorf("token model refusals by %v, want one tokens_per_day", by)
	}
	ms := s.Stats().Models[model]
	if ms.Admitted != 3 || ms.RateLimited != 2 || ms.RateLimitedBy["requests_per_day"] != 2 {
		t.Errorf("stats: %d admitted, %d refused, by %v; want 3 admitted, 2 refused per day", ms.Admitted, ms.RateLimited, ms.RateLimitedBy)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(limits) != 7 || limits[2] != "requests_per_day" || limits[4] != "requests_per_day" || limits[6] != "tokens_per_day" {
		t.Errorf("arrival hook limits %q, want the refusals named requests_per_day", limits)
	}
}

// sluiceCount counts as Sluice estimates: these tests compare costs they
// compute with package tokens.
var sluiceCount = sim.TokenCount{Mode: sim.CountSluice}
