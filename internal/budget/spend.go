package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/task"
)

// A SpendLedger keeps tenants' spend budgets: what their calls may cost per
// UTC day and per UTC month. Each window is one key in the budgets bucket
// (keys.Spend), changed only by compare-and-set, so every admission
// process of the fleet, and one restarted, shares it. A window holds what
// was spent (settled to reported usage) and what is held (reserved, not
// settled yet); a reservation is taken whole or not at all, only while
// spent + held + it stays within the cap, and is never shrunk to fit. So
// spend never exceeds a cap, whatever the concurrency, as long as a call
// costs no more than its reservation (its worst case).
//
// Amounts are billionths of the currency (Nanos), so sums are exact.
type SpendLedger struct {
	kv  KV
	now func() time.Time
}

// NewSpendLedger keeps spend windows in kv; now is the clock (nil: the
// system's).
func NewSpendLedger(kv KV, now func() time.Time) *SpendLedger {
	if now == nil {
		now = time.Now
	}
	return &SpendLedger{kv: kv, now: now}
}

// SpendCaps are a tenant's caps in billionths (0: none).
type SpendCaps struct{ PerDay, PerMonth int64 }

// Nanos converts an amount of currency to billionths, rounding up: a
// reservation is never short of the cost it stands for.
func Nanos(v float64) int64 { return int64(math.Ceil(v * 1e9)) }

// SpendRefusal says why a reservation was refused: the window (per_day or
// per_month) it did not fit, that window's cap, spent and held, and
// RetryAt, when waiting may help: soon if held reservations may come
// back, else when the window ends.
type SpendRefusal struct {
	Window             string
	Cap, Spent, Held   int64
	Amount             int64
	RetryAt, WindowEnd time.Time
}

func (r *SpendRefusal) Error() string {
	return fmt.Sprintf("spend budget %s: %s of %s spent and %s held; this job may cost up to %s",
		r.Window, money(r.Spent), money(r.Cap), money(r.Held), money(r.Amount))
}

func money(n int64) string { return fmt.Sprintf("%.6g", float64(n)/1e9) }

// spendWindow is a window's stored form.
type spendWindow struct {
	Spent int64 `json:"spent"`
	Held  int64 `json:"held"`
}

// spendRetry is how soon a job refused while reservations are held looks
// again: a settlement may give some back.
const spendRetry = time.Second

// Reserve holds amount in tenant's windows under caps. It returns the
// hold to settle later, or a refusal (and holds nothing).
func (l *SpendLedger) Reserve(ctx context.Context, tenant string, amount int64, caps SpendCaps) (task.SpendHold, *SpendRefusal, error) {
	now := l.now().UTC()
	h := task.SpendHold{Amount: amount}
	day, month := now.Format("20060102"), now.Format("200601")
	if caps.PerDay > 0 {
		end := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
		if ref, err := l.hold(ctx, tenant, "d"+day, amount, caps.PerDay, "per_day", end); ref != nil || err != nil {
			return h, ref, err
		}
		h.Day = day
	}
	if caps.PerMonth > 0 {
		end := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC)
		ref, err := l.hold(ctx, tenant, "m"+month, amount, caps.PerMonth, "per_month", end)
		if ref != nil || err != nil {
			if h.Day != "" {
				_ = l.Settle(ctx, tenant, h, 0)
			}
			return task.SpendHold{}, ref, err
		}
		h.Month = month
	}
	return h, nil, nil
}

// hold adds amount to one window's held if it fits under lim.
func (l *SpendLedger) hold(ctx context.Context, tenant, window string, amount, lim int64, name string, end time.Time) (*SpendRefusal, error) {
	var ref *SpendRefusal
	err := l.modify(ctx, keys.Spend(tenant, window), func(w *spendWindow) bool {
		if w.Spent+w.Held+amount > lim {
			ref = &SpendRefusal{Window: name, Cap: lim, Spent: w.Spent, Held: w.Held, Amount: amount, RetryAt: end, WindowEnd: end}
			if w.Spent+amount <= lim {
				ref.RetryAt = l.now().Add(spendRetry)
			}
			return false
		}
		ref = nil
		w.Held += amount
		return true
	})
	return ref, err
}

// Settle ends hold h: its amount leaves held and actual (billionths; the
// cost of the usage reported) is spent, in the windows h was taken in.
func (l *SpendLedger) Settle(ctx context.Context, tenant string, h task.SpendHold, actual int64) error {
	var errs []error
	for _, w := range []string{dayWindow(h.Day), monthWindow(h.Month)} {
		if w == "" {
			continue
		}
		errs = append(errs, l.modify(ctx, keys.Spend(tenant, w), func(sw *spendWindow) bool {
			sw.Held = max(sw.Held-h.Amount, 0)
			sw.Spent += max(actual, 0)
			return true
		}))
	}
	return errors.Join(errs...)
}

// Spent reads a tenant's window for a UTC day (20261203) or month
// (202612): what was spent and what is held.
func (l *SpendLedger) Spent(ctx context.Context, tenant, dayOrMonth string) (spent, held int64, err error) {
	w := dayWindow(dayOrMonth)
	if len(dayOrMonth) == 6 {
		w = monthWindow(dayOrMonth)
	}
	sw, _, err := l.load(ctx, keys.Spend(tenant, w))
	return sw.Spent, sw.Held, err
}

func dayWindow(d string) string {
	if d == "" {
		return ""
	}
	return "d" + d
}

func monthWindow(m string) string {
	if m == "" {
		return ""
	}
	return "m" + m
}

func (l *SpendLedger) load(ctx context.Context, key string) (spendWindow, uint64, error) {
	var w spendWindow
	e, err := l.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return w, 0, nil
	}
	if err != nil {
		return w, 0, fmt.Errorf("%w: get %s: %v", ErrUnavailable, key, err)
	}
	if err := json.Unmarshal(e.Value(), &w); err != nil {
		return w, 0, fmt.Errorf("spend %s: corrupt window: %w", key, err)
	}
	return w, e.Revision(), nil
}

// modify applies f to key's window by compare-and-set, retrying lost
// ones with the store's jittered, bounded backoff (backoff.go); f
// returning false writes nothing.
func (l *SpendLedger) modify(ctx context.Context, key string, f func(*spendWindow) bool) error {
	b := backoff{sleep: sleepCtx, now: l.now}
	for {
		w, rev, err := l.load(ctx, key)
		if err != nil {
			return err
		}
		if !f(&w) {
			return nil
		}
		data, _ := json.Marshal(w)
		if rev == 0 {
			_, err = l.kv.Create(ctx, key, data)
		} else {
			_, err = l.kv.Update(ctx, key, data, rev)
		}
		if err == nil {
			return nil
		}
		if !IsConflict(err) {
			return fmt.Errorf("%w: write %s: %v", ErrUnavailable, key, err)
		}
		if err := b.wait(ctx, "spend", key); err != nil {
			return err
		}
	}
}
