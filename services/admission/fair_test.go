package admission

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// bodyMsg is a QUEUE message as hold sees it: its size only.
type bodyMsg struct{ jetstream.Msg }

func (bodyMsg) Data() []byte { return make([]byte, 200) }

// fairSetup is a Service holding jobs for the model m of the provider p
// configured as model, on the path admission takes: hold (the job's cost
// and charge, its tenant's queue) then the queue's Pop, in fair order.
type fairSetup struct {
	t   *testing.T
	s   *Service
	n   int
	now time.Time
}

// deployment is a provider line of name serving model.
func deployment(name, model string) string {
	return fmt.Sprintf("  - {name: %s, base_url: http://127.0.0.1:1/v1, models: [%s]}\n", name, model)
}

// newFairSetup configures providers, or the provider p serving model m as
// model when it has no newline.
func newFairSetup(t *testing.T, providers string) *fairSetup {
	t.Helper()
	if !strings.Contains(providers, "\n") {
		providers = deployment("p", providers)
	}
	cfg, err := config.Parse([]byte("providers:\n" + providers + "tenants: [{name: a}, {name: b}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := newService(&env{cfg: Config{App: cfg}})
	return &fairSetup{t: t, s: s, now: time.Unix(1_000_000, 0)}
}

// push holds n jobs of tenant, each of prompt + out tokens.
func (f *fairSetup) push(tenant string, n, prompt, out int) {
	for range n {
		f.n++
		est := job.Estimate{PromptTokens: prompt, MaxTokens: out}
		j := &task.Task{Job: job.Job{ID: fmt.Sprintf("j%d", f.n), Tenant: tenant, Priority: job.Standard, Provider: "p"}, Model: "m", Estimate: &est}
		f.s.holder.hold(&Candidate{Job: j, Msg: bodyMsg{}}, f.now)
	}
}

// pop takes the next n jobs in fair order, one a second (a 60-RPM model's
// pace), as dispatchAll does, and counts them per tenant.
func (f *fairSetup) pop(n int) (got map[string]int, order string) {
	q := f.s.holder.queues[budget.ModelKey("p", "m")]
	got = map[string]int{}
	for range n {
		it := q.sched.Pop(f.now)
		if it == nil {
			f.t.Fatalf("nothing to pop after %v", got)
		}
		f.s.holder.held.remove(it)
		got[it.Tenant]++
		order += it.Tenant
		f.now = f.now.Add(time.Second)
	}
	return got, order
}

// TestLateTenantGetsHalfOnRPMBoundModel: on a model whose requests bind
// (60 a minute against a million tokens), a tenant's 40 small jobs cost 40
// requests, not 800 tokens: a tenant arriving 5 s later goes first with its
// first job and then takes turns, getting about half of the next calls.
// (Charged in tokens, the first tenant's new-flow quantum of 2,000 tokens
// covered all its 40 jobs: the late one got none of the next 20.)
func TestLateTenantGetsHalfOnRPMBoundModel(t *testing.T) {
	t.Parallel()
	f := newFairSetup(t, "{name: m, rpm: 60, tpm: 1000000}")
	f.push("a", 40, 10, 10)
	f.pop(5) // a's first five calls, a second apart
	f.push("b", 40, 10, 10)
	got, order := f.pop(20)
	if k := strings.IndexByte(order, 'b'); k != 0 {
		t.Errorf("the late tenant's first job went at %d (%s), want 0: a new flow goes first", k, order)
	}
	if got["b"] < 8 || got["b"] > 12 {
		t.Errorf("of the next 20 calls the late tenant got %d (%s), want about half (8-12)", got["b"], order)
	}
}

// TestRPMBoundModelDoesNotStarveBigRequests: on the same model a 100,000-
// token job binds by tokens (a tenth of the minute), a 20-token one by
// requests (a sixtieth): each tenant gets half of the minute, the big
// jobs' tenant one call to the other's six, and is never starved.
func TestRPMBoundModelDoesNotStarveBigRequests(t *testing.T) {
	t.Parallel()
	f := newFairSetup(t, "{name: m, rpm: 60, tpm: 1000000}")
	f.push("a", 40, 99_000, 1000)
	f.push("b", 200, 10, 10)
	got, order := f.pop(70)
	if got["a"] < 8 || got["a"] > 12 {
		t.Errorf("of 70 calls the big jobs' tenant got %d (%s), want about 10 (a tenth of the minute each, like six small ones)", got["a"], order)
	}
}

// TestTokenBoundModelSharesByTokens: where tokens bind (10,000 requests a
// minute against a million tokens, a request's worth 100 tokens), tenants
// still share the tokens, whatever their request sizes.
func TestTokenBoundModelSharesByTokens(t *testing.T) {
	t.Parallel()
	f := newFairSetup(t, "{name: m, rpm: 10000, tpm: 1000000}")
	f.push("a", 300, 4000, 1000)
	f.push("b", 3000, 150, 50)
	got, order := f.pop(1000)
	ta, tb := got["a"]*5000, got["b"]*200
	if share := float64(ta) / float64(ta+tb); share < 0.45 || share > 0.55 {
		t.Errorf("big jobs' tenant got %.3f of the tokens (%d calls, %d small), want 0.5 ± 0.05 (%.60s…)", share, got["a"], got["b"], order)
	}
}

func TestFairCharge(t *testing.T) {
	t.Parallel()
	small := budget.Cost{Requests: 1, Tokens: 20}
	for _, tc := range []struct {
		name          string
		models        string // the group's deployments
		cost          budget.Cost
		charge, quant int
	}{
		{"request-bound: a request's worth", "{name: m, rpm: 60, tpm: 1000000}", small, 16_667, 16_667},
		{"token-bound: its tokens", "{name: m, rpm: 60, tpm: 1000000}", budget.Cost{Requests: 1, Tokens: 50_000}, 50_000, 16_667},
		{"a request smaller than the quantum", "{name: m, rpm: 10000, tpm: 1000000}", small, 100, 2000},
		{"no request limit: tokens", "{name: m, tpm: 1000000}", small, 20, 2000},
		{"no token limit: a request is a quantum", "{name: m, rpm: 60}", budget.Cost{Requests: 1, Tokens: 90_000}, 2000, 2000},
		{"no limits: tokens", "{name: m}", small, 20, 2000},
		{"units: an image is a fiftieth", "{name: m, rpm: 600, tpm: 1000000, units: {images: 50}}", budget.Cost{Requests: 1, Tokens: 20, Units: [budget.MaxUnits]int{2}}, 40_000, 20_000},
		{"group: the deployments' sum", deployment("p", "{name: m, rpm: 60, tpm: 1000000}") + deployment("q", "{name: m, rpm: 30, tpm: 500000}"), small, 16_667, 16_667},
		{"group: unlimited on one is unlimited", deployment("p", "{name: m, rpm: 60, tpm: 1000000}") + deployment("q", "{name: m, tpm: 1000000}"), small, 20, 2000},
		{"anthropic: output against otpm", "  - {name: p, kind: anthropic, base_url: http://127.0.0.1:1/v1, models: [{name: m, rpm: 1000, itpm: 60000, otpm: 30000}]}\n", budget.Cost{Requests: 1, Tokens: 100, Output: 500}, 1000, 2000},
	} {
		f := newFairSetup(t, tc.models)
		q := f.s.holder.queueOf(&task.Task{Job: job.Job{Provider: "p"}, Model: "m"})
		if got := q.fair.charge(tc.cost); got != tc.charge {
			t.Errorf("%s: charge %d, want %d", tc.name, got, tc.charge)
		}
		if got := q.fair.quantum(2000); got != tc.quant {
			t.Errorf("%s: quantum %d, want %d", tc.name, got, tc.quant)
		}
	}
}
