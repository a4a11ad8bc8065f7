package sim_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// slowBody is a request body whose first read comes late: the clock
// advances by d before it returns, as when the server reads and parses a
// request some time after it arrived.
type slowBody struct {
	r    io.Reader
	clk  *clock
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
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 60}}, Now: clk.Now}) // 1 request a second
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
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 60}}, Now: clk.Now, // 1 request a second
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
