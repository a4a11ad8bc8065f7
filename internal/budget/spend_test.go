package budget_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
)

// spendKV is a budgets bucket on a fresh embedded server.
func spendKV(t *testing.T) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(natstest.Conn(t, natstest.Server(t)))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "budgets"})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

const unit = int64(1e9) // one unit of currency

func TestSpendLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	l := budget.NewSpendLedger(spendKV(t), func() time.Time { return now })
	caps := budget.SpendCaps{PerDay: 10 * unit}
	a, ref, err := l.Reserve(ctx, "acme", 4*unit, caps)
	if err != nil || ref != nil {
		t.Fatalf("first hold: %v, %v", ref, err)
	}
	if a.Day != "20261203" || a.Month != "" || a.Amount != 4*unit {
		t.Errorf("hold %+v, want 4 units in day 20261203 only", a)
	}
	if _, ref, _ = l.Reserve(ctx, "acme", 4*unit, caps); ref != nil {
		t.Fatalf("second hold refused: %v", ref)
	}
	// 8 held: 3 more does not fit, and is not shrunk to the 2 left. It
	// may fit once the holds settle below their worst case: look soon.
	_, ref, _ = l.Reserve(ctx, "acme", 3*unit, caps)
	if ref == nil || ref.Window != "per_day" || ref.Held != 8*unit || !ref.RetryAt.Equal(now.Add(time.Second)) {
		t.Fatalf("refusal %+v, want per_day with 8 held, retry in a second", ref)
	}
	if _, held, _ := l.Spent(ctx, "acme", "20261203"); held != 8*unit {
		t.Errorf("a refused hold changed held: %d, want 8 units", held)
	}
	// One job cost 1: 3 of its 4 come back.
	if err := l.Settle(ctx, "acme", a, unit); err != nil {
		t.Fatal(err)
	}
	if spent, held, _ := l.Spent(ctx, "acme", "20261203"); spent != unit || held != 4*unit {
		t.Errorf("after settling: spent %d held %d, want 1 and 4 units", spent, held)
	}
	if _, ref, _ = l.Reserve(ctx, "acme", 5*unit, caps); ref != nil {
		t.Errorf("5 units refused with 1 spent and 4 held of 10: %v", ref)
	}
	// 10 - 1 spent < 10: nothing settled can make room; wait for tomorrow.
	_, ref, _ = l.Reserve(ctx, "acme", 10*unit, caps)
	if ref == nil || !ref.RetryAt.Equal(time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("refusal %+v, want a retry when the UTC day ends", ref)
	}
	// Another tenant's window is its own.
	if _, ref, _ = l.Reserve(ctx, "globex", 10*unit, caps); ref != nil {
		t.Errorf("globex refused: %v", ref)
	}
}

// A month cap that refuses gives back what the day took.
func TestSpendLedgerMonthRefusalUndoesDay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC)
	l := budget.NewSpendLedger(spendKV(t), func() time.Time { return now })
	caps := budget.SpendCaps{PerDay: 10 * unit, PerMonth: 5 * unit}
	_, ref, err := l.Reserve(ctx, "acme", 6*unit, caps)
	if err != nil || ref == nil || ref.Window != "per_month" || !ref.WindowEnd.Equal(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("refusal %+v (%v), want per_month ending 2027-01-01", ref, err)
	}
	if _, held, _ := l.Spent(ctx, "acme", "20261231"); held != 0 {
		t.Errorf("day window holds %d after the month refused, want 0", held)
	}
	h, ref, _ := l.Reserve(ctx, "acme", 5*unit, caps)
	if ref != nil || h.Day != "20261231" || h.Month != "202612" {
		t.Fatalf("hold %+v refused %v, want one in both windows", h, ref)
	}
	// The next day (and month) has its own windows; the old hold settles
	// in the windows it was taken in.
	now = now.Add(2 * time.Hour)
	if _, ref, _ := l.Reserve(ctx, "acme", 5*unit, caps); ref != nil {
		t.Errorf("a new month's hold refused: %v", ref)
	}
	if err := l.Settle(ctx, "acme", h, 2*unit); err != nil {
		t.Fatal(err)
	}
	if spent, held, _ := l.Spent(ctx, "acme", "202612"); spent != 2*unit || held != 0 {
		t.Errorf("December: spent %d held %d, want 2 units and 0", spent, held)
	}
	if spent, held, _ := l.Spent(ctx, "acme", "202701"); spent != 0 || held != 5*unit {
		t.Errorf("January: spent %d held %d, want 0 and 5 units", spent, held)
	}
}

// Two ledgers on one bucket (two admission processes) racing for one
// window never hold more than its cap together.
func TestSpendLedgerConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kv := spendKV(t)
	now := func() time.Time { return time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC) }
	ledgers := []*budget.SpendLedger{budget.NewSpendLedger(kv, now), budget.NewSpendLedger(kv, now)}
	caps := budget.SpendCaps{PerDay: 15 * unit}
	var held atomic.Int64
	var holds sync.Map
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			h, ref, err := ledgers[i%2].Reserve(ctx, "acme", unit, caps)
			if err != nil {
				t.Error(err)
				return
			}
			if ref == nil {
				held.Add(1)
				holds.Store(i, h)
			}
		})
	}
	wg.Wait()
	if held.Load() != 15 {
		t.Errorf("%d holds of 1 granted under a cap of 15, want 15", held.Load())
	}
	if _, h, _ := ledgers[0].Spent(ctx, "acme", "20261203"); h != 15*unit {
		t.Errorf("window holds %d, want 15 units", h)
	}
	holds.Range(func(_, v any) bool {
		if err := ledgers[1].Settle(ctx, "acme", v.(task.SpendHold), 0); err != nil {
			t.Error(err)
		}
		return true
	})
	if s, h, _ := ledgers[0].Spent(ctx, "acme", "20261203"); s != 0 || h != 0 {
		t.Errorf("after giving every hold back: spent %d held %d, want 0", s, h)
	}
}
