package admission

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// heldMsg is a QUEUE message as the gates see it: they only send it back.
type heldMsg struct {
	jetstream.Msg
	naks int
}

func (m *heldMsg) NakWithDelay(time.Duration) error { m.naks++; return nil }

func TestHeldSet(t *testing.T) {
	t.Parallel()
	h := newHeldSet()
	a := &Item{Size: 100, Value: &Candidate{Job: &task.Task{Job: job.Job{ID: "a", Tenant: "t"}}}}
	b := &Item{Size: 50, Value: &Candidate{Job: &task.Task{Job: job.Job{ID: "b", Tenant: "t"}}}}
	h.add("k1", a)
	h.add("k2", b)
	if got, ok := h.get("t.b"); !ok || got.key != "k2" || got.c != b.Value {
		t.Fatalf("get(t.b) = %+v, %v; want key k2 and b's candidate", got, ok)
	}
	if h.n != 2 || h.bytes != 150 {
		t.Fatalf("n, bytes = %d, %d; want 2, 150", h.n, h.bytes)
	}
	if !h.over(1, 1000) || !h.over(10, 149) || h.over(2, 150) {
		t.Fatalf("over: want true past either bound and false at both")
	}
	// Another tenant's job with the same id is another job.
	b2 := &Item{Size: 10, Value: &Candidate{Job: &task.Task{Job: job.Job{ID: "b", Tenant: "u"}}}}
	h.add("k3", b2)
	if got, ok := h.get("t.b"); !ok || got.c != b.Value {
		t.Fatalf("get(t.b) after u's b = %+v, %v; want t's b", got, ok)
	}
	h.remove(b2)
	h.remove(a)
	if _, ok := h.get("t.a"); ok || h.n != 1 || h.bytes != 50 {
		t.Fatalf("after remove(a): held a %v, n %d, bytes %d; want false, 1, 50", ok, h.n, h.bytes)
	}
	if _, ok := h.get("t.b"); !ok {
		t.Fatal("t's b gone with u's")
	}
}

// gateService is an admission service on an embedded server, not running:
// its gates are driven directly. Tenant t may make 2 requests a minute;
// model p/m may take 1 request a day, model p/free any.
func gateService(t *testing.T) *Service {
	t.Helper()
	m := meshtest.New(t, streams.Options{})
	cfg, err := config.Parse([]byte(`
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: m, rpm: 1000, tpm: 1000000, rpd: 1}, {name: free, rpm: 1000, tpm: 1000000}]
tenants: [{name: t, rpm: 2}]
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{App: cfg}, m, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestGatesGiveBackWhatALaterGateRefused: a job the model's day quota
// refuses gives back the tenant minute it took, so the tenant's second
// request of the minute is still there for a job on another model.
func TestGatesGiveBackWhatALaterGateRefused(t *testing.T) {
	t.Parallel()
	s := gateService(t)
	ctx := context.Background()
	cand := func(id string) (*Candidate, *heldMsg) {
		msg := &heldMsg{}
		return &Candidate{Job: &task.Task{Job: job.Job{ID: id, Tenant: "t", Provider: "p"}}, Msg: msg, Cost: budget.Cost{Requests: 1, Tokens: 10}}, msg
	}
	_, day, _ := s.cfg.App.ModelRef("m")
	_, free, _ := s.cfg.App.ModelRef("free")

	a, _ := cand("a")
	taken, passed, err := s.gates.passGates(ctx, a, s.gates.gatesFor(a, "p", day))
	if err != nil || !passed || len(taken) != 2 {
		t.Fatalf("first job: passed %v, %d gates taken, err %v; want passed, 2 (tenant minute, model day)", passed, len(taken), err)
	}
	b, bmsg := cand("b")
	if _, passed, err := s.gates.passGates(ctx, b, s.gates.gatesFor(b, "p", day)); err != nil || passed || bmsg.naks != 1 {
		t.Fatalf("second job on m: passed %v, naks %d, err %v; want refused by the day quota and sent back once", passed, bmsg.naks, err)
	}
	c, cmsg := cand("c")
	if _, passed, err := s.gates.passGates(ctx, c, s.gates.gatesFor(c, "p", free)); err != nil || !passed {
		t.Fatalf("third job on free: passed %v (naks %d), err %v; want passed: the refused job gave its tenant minute back", passed, cmsg.naks, err)
	}
	d, dmsg := cand("d")
	if _, passed, err := s.gates.passGates(ctx, d, s.gates.gatesFor(d, "p", free)); err != nil || passed || dmsg.naks != 1 {
		t.Fatalf("fourth job on free: passed %v, naks %d, err %v; want refused: the tenant's 2 requests are spent", passed, dmsg.naks, err)
	}
	d.Job.Gated = true
	if gs := s.gates.gatesFor(d, "p", day); len(gs) != 0 {
		t.Fatalf("a gated job has %d gates; want none (it paid when first placed)", len(gs))
	}
}
