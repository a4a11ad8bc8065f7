package bench

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// The floor's provider call carries what the executor's does
// (provider.Call): an Idempotency-Key and the job's X-Sluice-Job-Id, so
// the simulator runs it through the same ledger as Sluice's calls.
func TestFloorCallSendsExecutorHeaders(t *testing.T) {
	t.Parallel()
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: Model}}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	defer ts.Close()
	p := &floorPipeline{providerURL: ts.URL, http: &http.Client{Timeout: 30 * time.Second}}
	for _, id := range []string{"job-a", "job-b"} {
		if err := p.call(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	for _, id := range []string{"job-a", "job-b"} {
		if got := st.JobCompletions[id]; got != 1 {
			t.Errorf("completions with X-Sluice-Job-Id %s: got %d, want 1", id, got)
		}
		if got := st.IdempotencyCompletions["floor-"+id]; got != 1 {
			t.Errorf("completions with Idempotency-Key floor-%s: got %d, want 1", id, got)
		}
	}
}
