package result

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// logLines is a log sink tests read JSON lines from.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// find returns the first line whose job_id is id.
func (l *logLines) find(id string) (map[string]any, string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range strings.Split(l.buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["job_id"] == id {
			return m, line, true
		}
	}
	return nil, "", false
}

const pricedYAML = `providers:
  - name: p
    base_url: "http://127.0.0.1:1/v1"
    models:
      - {name: m, price: {input_per_mtok: 3, output_per_mtok: 15, cached_input_per_mtok: 0.3}}
      - {name: free}
`

// A finished job's one log line carries the request log's fields (and no
// content: the caller's user only hashed), its cost is counted, and its
// spend hold settles to the cost: what was held beyond it comes back.
func TestRequestLogLine(t *testing.T) {
	t.Parallel()
	logs := &logLines{}
	f := setupLogged(t, pricedYAML+"tenants: [{name: acme, spend: {per_day: 10}}]\n", slog.New(slog.NewJSONHandler(logs, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ledger := budget.NewSpendLedger(f.mesh.Budgets, nil)
	hold, ref, err := ledger.Reserve(ctx, "acme", budget.Nanos(0.5), budget.SpendCaps{PerDay: budget.Nanos(10)})
	if err != nil || ref != nil {
		t.Fatalf("hold: %v %v", ref, err)
	}
	sub := time.Now().Add(-3 * time.Second).UTC()
	j := &task.Task{
		Job:         job.Job{ID: job.NewID(), Tenant: "acme", Priority: job.Interactive, Request: json.RawMessage(`{"model":"m","user":"alice@example.com","messages":[{"role":"user","content":"the secret plan"}]}`)},
		SubmittedAt: sub,
		SpendHold:   &hold,
		WaitReason:  "tenant_rpm",
		Attempts:    []job.Attempt{{N: 1, StartedAt: sub.Add(1500 * time.Millisecond)}},
	}
	facts := mesh.FactsOf(j)
	facts.TTFTMS = 120
	j.Provider, j.Model = "p", "m"
	res, err := f.mesh.Finish(ctx, j, mesh.Outcome{Status: job.StatusSucceeded, Response: json.RawMessage(`{"content":"the secret answer"}`),
		Usage: &job.Usage{PromptTokens: 1000, CachedTokens: 400, CompletionTokens: 100, TotalTokens: 1100}},
		mesh.Exit{Hints: mesh.ResultHints{Facts: facts}, Price: f.svc.app(), Now: sub.Add(3 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	wantCost := (600*3 + 400*0.3 + 100*15) / 1e6
	if res.Cost == nil || math.Abs(*res.Cost-wantCost) > 1e-12 {
		t.Fatalf("cost %v, want %v", res.Cost, wantCost)
	}
	var line map[string]any
	var raw string
	natstest.Eventually(t, 10*time.Second, func() error {
		var ok bool
		if line, raw, ok = logs.find(j.ID); !ok {
			return errors.New("no log line for the job yet")
		}
		return nil
	})
	for k, want := range map[string]any{"msg": "job finished", "level": "INFO", "tenant": "acme", "model": "m", "deployment": "p",
		"priority": "interactive", "status": "succeeded", "attempts": 1.0, "prompt_tokens": 1000.0, "completion_tokens": 100.0,
		"cached_tokens": 400.0, "usage_source": "provider", "queue_wait_ms": 1500.0, "wait_reason": "tenant_rpm", "ttft_ms": 120.0, "latency_ms": 3000.0, "cost": wantCost} {
		if got := line[k]; got != want {
			t.Errorf("%s = %v (%T), want %v", k, got, got, want)
		}
	}
	if u, _ := line["user_hash"].(string); len(u) != 12 {
		t.Errorf("user_hash = %q, want 12 hex digits", line["user_hash"])
	}
	if _, ok := line["trace_id"]; ok {
		t.Errorf("trace_id present for a job without one: %s", raw)
	}
	for _, secret := range []string{"alice", "secret plan", "secret answer"} {
		if strings.Contains(raw, secret) {
			t.Errorf("the log line holds %q: %s", secret, raw)
		}
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		if spent, held, err := ledger.Spent(ctx, "acme", hold.Day); err != nil || spent != budget.Nanos(wantCost) || held != 0 {
			return errors.New("spend hold not settled to the cost yet")
		}
		return nil
	})
	if got := count(f.ms.Cost.WithLabelValues("acme", "p", "m")); math.Abs(got-wantCost) > 1e-12 {
		t.Errorf("sluice_cost_total = %v, want %v", got, wantCost)
	}
}

// An unpriced model's result says so in the line, with no cost.
func TestRequestLogUnpriced(t *testing.T) {
	t.Parallel()
	logs := &logLines{}
	f := setupLogged(t, pricedYAML+"tenants: [{name: acme}]\n", slog.New(slog.NewJSONHandler(logs, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	j := &task.Task{Job: job.Job{ID: job.NewID(), Tenant: "acme", Provider: "p"}, Model: "free"}
	res, err := f.mesh.Finish(ctx, j, mesh.Outcome{Status: job.StatusSucceeded, Usage: &job.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}},
		mesh.Exit{Price: f.svc.app()})
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		line, raw, ok := logs.find(res.JobID)
		if !ok {
			return errors.New("no log line yet")
		}
		if _, has := line["cost"]; has || line["cost_unpriced"] != true {
			t.Errorf("unpriced line %s: want cost_unpriced and no cost", raw)
		}
		return nil
	})
}
