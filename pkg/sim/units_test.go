package sim_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// imageBody is a chat body that asks for n images in the simulator's
// "sim_units" field.
func imageBody(n int) string {
	b := body("painter", "a cat", 16)
	return strings.TrimSuffix(b, "}") + `,"sim_units":{"images":` + strconv.Itoa(n) + `}}`
}

// TestUnitLimits: a third unit is enforced like requests and tokens under
// the quantized profile (a sliding minute at the limit, a sliding second at
// ceil(limit/60), a request alone in its second passing the cap), counted
// in Stats per unit, and refused with a 429 naming the unit.
func TestUnitLimits(t *testing.T) {
	t.Parallel()
	clk := newClock()
	s, url := start(t, sim.Config{Now: clk.Now, Models: []sim.ModelLimits{
		{Name: "painter", RPM: 10_000, TPM: 10_000_000, Units: map[string]int{"images": 120, "tasks": 0}},
	}})
	// 120 a minute: 2 a second.
	wantStatus(t, chat(t, url, imageBody(1)), http.StatusOK)
	wantStatus(t, chat(t, url, imageBody(1)), http.StatusOK)
	r := chat(t, url, imageBody(1))
	wantStatus(t, r, http.StatusTooManyRequests)
	if e := r.apiErr(t); e["type"] != "images" || !strings.Contains(e["message"].(string), "on images per min: Limit 120 (2 per second)") {
		t.Errorf("refusal %v, want it to name images and their limits", e)
	}
	if r.header.Get("Retry-After") == "" && r.header.Get("retry-after-ms") == "" {
		t.Errorf("refusal without a retry hint: %v", r.header)
	}
	// A request stating none of the unit costs one.
	clk.Advance(time.Second)
	wantStatus(t, chat(t, url, body("painter", "a dog", 16)), http.StatusOK)
	wantStatus(t, chat(t, url, imageBody(2)), http.StatusTooManyRequests)
	// Alone in its second, a request above the quantum passes.
	clk.Advance(time.Second)
	wantStatus(t, chat(t, url, imageBody(5)), http.StatusOK)
	// More than the minute: never.
	clk.Advance(2 * time.Second)
	wantStatus(t, chat(t, url, imageBody(121)), http.StatusTooManyRequests)

	st := s.Stats().Models["painter"]
	u := st.Units["images"]
	want := sim.UnitStats{Limit: 120, Quantum: 2, Charged: 8, RateLimited: 3,
		MaxIn60s: 1 + 1 + 1 + 1 + 2 + 5 + 121, MaxIn1s: 121, MaxAdmittedIn60s: 8, MaxAdmittedIn1s: 5}
	if u != want {
		t.Errorf("images stats %+v, want %+v", u, want)
	}
	if got := st.Units["tasks"]; got.Limit != 0 || got.Charged != 4 || got.RateLimited != 0 {
		t.Errorf("tasks (counted, no limit) %+v, want 4 charged, none refused", got)
	}
	if st.RateLimited != 3 || st.Admitted != 4 {
		t.Errorf("model: %d admitted, %d rate limited; want 4 and 3", st.Admitted, st.RateLimited)
	}
}

// TestUnitsOf: a test may read units from the body its own way.
func TestUnitsOf(t *testing.T) {
	t.Parallel()
	s, url := start(t, sim.Config{
		Models: []sim.ModelLimits{{Name: "painter", Units: map[string]int{"images": 6000}}},
		UnitsOf: func(body []byte) map[string]int {
			if strings.Contains(string(body), "two cats") {
				return map[string]int{"images": 2}
			}
			return map[string]int{"images": 0}
		},
	})
	wantStatus(t, chat(t, url, body("painter", "two cats", 16)), http.StatusOK)
	wantStatus(t, chat(t, url, body("painter", "words only", 16)), http.StatusOK)
	if got := s.Stats().Models["painter"].Units["images"].Charged; got != 2 {
		t.Errorf("charged %d images, want 2", got)
	}
}
