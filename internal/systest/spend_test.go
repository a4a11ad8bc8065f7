package systest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/streams"
)

// TestSpendBudgetNeverOvershoots: 200 concurrent jobs of one tenant
// against a per_day spend budget worth 50 jobs at their worst case, placed
// by two admission processes (two nodes on one NATS). The provider's own
// ledger (each answer's usage at the model's price, summed at every
// completion) never shows spend above the budget; the jobs that do not fit
// are refused at once with spend_budget_exceeded (refuse) or wait and
// expire, naming the spend budget, once nothing can free room for them
// before their deadline (wait); every result's cost is its usage times the
// price.
//
// The simulator counts prompts at 0.6 of its default, below Sluice's
// estimate: the guarantee holds while a call costs no more than its worst
// case, and the hold uses the learned correction when providers count
// above the estimate (a fresh model has none yet). It answers every call
// with max_tokens of output, the worst case's output.
func TestSpendBudgetNeverOvershoots(t *testing.T) {
	SkipShort(t)
	t.Parallel()
	for _, mode := range []string{"refuse", "wait"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			spendRun(t, mode)
		})
	}
}

// The model's price per million tokens, as configured below.
const spendIn, spendOut = 2.5, 10.0

func spendRun(t *testing.T, mode string) {
	if now := time.Now().UTC(); now.Add(3*time.Minute).Day() != now.Day() {
		t.Skip("too close to the end of the UTC day: the spend window would change during the run")
	}
	const model, jobs, maxTokens = "gpt-4o", 200, 200
	body := ChatBody(model, 40, maxTokens)
	_, est, err := tokens.Estimate(job.EndpointChat, body, job.DefaultLimits, 1024)
	if err != nil {
		t.Fatal(err)
	}
	// Admission holds the prompt at the fleet's correction, which starts
	// at calib.Prior until it learns the provider's counts.
	worst := (float64(calib.Placed(est.PromptTokens, calib.Prior))*spendIn + float64(est.MaxTokens)*spendOut) / 1e6
	perDay := 50.5 * worst // 50 jobs at worst case fit, the 51st does not
	simSrv, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 1_000_000, TPM: 1_000_000_000}},
		APIKeys: []string{"sim-secret"}, Count: sim.TokenCount{Factor: 0.6}, TTFT: 20 * time.Millisecond,
		OutputTokens: func(max int, _ []byte) int { return max }})
	if err != nil {
		t.Fatal(err)
	}
	led := &providerLedger{budget: perDay}
	ts := httptest.NewServer(led.wrap(simSrv))
	t.Cleanup(ts.Close)
	cfg := fmt.Sprintf(`
server: {open: true}
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: %s, rpm: 1000000, tpm: 1000000000, max_concurrency: 64, price: {input_per_mtok: %g, output_per_mtok: %g}}
tenants:
  - {name: acme, spend: {per_day: %g, on_exceed: %s}}
`, ts.URL, model, spendIn, spendOut, perDay, mode)
	// Two admission processes, and the result service (which settles the
	// holds) in a process of its own, with its own NATS permissions.
	n := StartWith(t, cfg, Setup{Env: Env, Services: []string{"ingest", "admission", "executor"}})
	n2 := StartWith(t, cfg, Setup{Env: Env, NATSURL: n.NATS, Data: n.Data, Services: []string{"admission"}})
	res := StartWith(t, cfg, Setup{Env: Env, NATSURL: n.NATS, Data: n.Data, Services: []string{"result"}})
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results := make([]*job.Result, jobs)
	var wg sync.WaitGroup
	for i := range jobs {
		wg.Go(func() {
			j := &job.Job{Tenant: "acme", Request: body}
			if mode == "wait" {
				// A job that cannot fit before its deadline (nothing held
				// can free enough, and the day ends after it) ends then.
				dl := time.Now().Add(time.Minute)
				j.Deadline = &dl
			}
			r, err := cl.Do(ctx, j)
			if err != nil {
				t.Errorf("job %d: %v", i, err)
				return
			}
			results[i] = r
		})
	}
	wg.Wait()
	led.check(t)
	succeeded, other := 0, 0
	for _, r := range results {
		if r == nil {
			continue
		}
		switch {
		case r.Status == job.StatusSucceeded:
			succeeded++
			checkCost(t, r)
		case mode == "refuse" && r.Status == job.StatusFailed && r.Error.Code == job.CodeSpendBudget,
			mode == "wait" && r.Status == job.StatusExpired && strings.Contains(r.Error.Message, "spend budget"):
			other++
		default:
			t.Errorf("job %s: %s %+v, want succeeded or ended by the spend budget (%s)", r.JobID, r.Status, r.Error, mode)
		}
	}
	if succeeded < 50 || other == 0 {
		t.Errorf("%d succeeded and %d ended by the spend budget; want at least 50 and some", succeeded, other)
	}
	if led.calls() != succeeded {
		t.Errorf("the provider answered %d calls, %d jobs succeeded", led.calls(), succeeded)
	}
	for i, node := range []Node{n, n2} {
		if MetricSum(t, node.MetricsURL(), "llm_tokens_reserved_total") == 0 {
			t.Errorf("admission process %d placed no job; want both to share the work", i+1)
		}
	}
	// The result service settles each hold to its cost as it records the
	// result: the window ends holding nothing, having spent what the
	// provider's ledger shows.
	nc, _ := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, streams.BucketBudgets)
	if err != nil {
		t.Fatal(err)
	}
	spend := budget.NewSpendLedger(kv, nil)
	natstest.Eventually(t, 20*time.Second, func() error {
		spent, held, err := spend.Spent(ctx, "acme", time.Now().UTC().Format("20060102"))
		if want := budget.Nanos(led.total()); err != nil || held != 0 || math.Abs(float64(spent-want)) > float64(led.calls()) {
			return fmt.Errorf("spend window: spent %d held %d (%v), want %d spent and nothing held", spent, held, err, want)
		}
		return nil
	})
	// The result service counts each result as it records it.
	natstest.Eventually(t, 20*time.Second, func() error {
		if got, want := MetricSum(t, res.MetricsURL(), "sluice_cost_total", `tenant="acme"`), led.total(); math.Abs(got-want) > 1e-9 {
			return fmt.Errorf("sluice_cost_total = %.9f, the provider's ledger %.9f", got, want)
		}
		return nil
	})
}

// checkCost checks a result's cost is its usage times the price.
func checkCost(t *testing.T, r *job.Result) {
	t.Helper()
	if r.Usage == nil || r.Cost == nil || r.UsageSource != job.UsageProvider {
		t.Errorf("job %s: usage %+v, cost %v, source %q; want the provider's usage and its cost", r.JobID, r.Usage, r.Cost, r.UsageSource)
		return
	}
	want := (float64(r.Usage.PromptTokens)*spendIn + float64(r.Usage.CompletionTokens)*spendOut) / 1e6
	if math.Abs(*r.Cost-want) > 1e-12 {
		t.Errorf("job %s: cost %v, want %v", r.JobID, *r.Cost, want)
	}
}

// providerLedger sums, at the provider, what each answered call costs
// by the usage in its answer, and remembers the highest sum seen.
type providerLedger struct {
	budget float64
	mu     sync.Mutex
	spent  float64
	high   float64
	n      int
}

func (l *providerLedger) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		var a struct {
			Usage *job.Usage `json:"usage"`
		}
		if rec.Code == http.StatusOK && json.Unmarshal(rec.Body.Bytes(), &a) == nil && a.Usage != nil {
			l.mu.Lock()
			l.spent += (float64(a.Usage.PromptTokens)*spendIn + float64(a.Usage.CompletionTokens)*spendOut) / 1e6
			l.high, l.n = max(l.high, l.spent), l.n+1
			l.mu.Unlock()
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = bytes.NewReader(rec.Body.Bytes()).WriteTo(w)
	})
}

func (l *providerLedger) check(t *testing.T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.high > l.budget*(1+1e-9) {
		t.Errorf("the provider's ledger reached %.9f, above the budget %.9f", l.high, l.budget)
	}
	t.Logf("provider ledger: %d calls, %.9f spent of %.9f", l.n, l.spent, l.budget)
}

func (l *providerLedger) total() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.spent
}

func (l *providerLedger) calls() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}
