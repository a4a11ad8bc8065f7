package admission

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// outage owns whether this process can reach the budget store, as the
// scheduler sees it, and when it lets its held jobs go to a process that
// can (LetGoAfter).
type outage struct {
	*env
	holder    *holder      // letGoAll
	budgetErr atomic.Value // last budget store error (string), "" when healthy
	letGo     time.Duration
	// The budget store's outage as the scheduler sees it (its goroutine
	// only): failing without a break since downSince, last failed at
	// downLast.
	downSince, downLast time.Time
	lettingGo           bool
}

func (o *outage) storeDown(key string, err error) {
	o.m.BudgetErrors.Inc()
	o.budgetErr.Store(err.Error())
	now := o.now()
	if o.downSince.IsZero() {
		o.downSince = now
	}
	o.downLast = now
	o.log.Warn("budget store unavailable; holding jobs", "key", key, "err", err)
}

func (o *outage) storeUp() {
	o.budgetErr.Store("")
	if o.lettingGo {
		o.log.Info("budget store reachable again; taking jobs")
	}
	o.downSince, o.downLast, o.lettingGo = time.Time{}, time.Time{}, false
}

// LetGoAfter: a process whose budget store has failed this long without a
// break (its node cut off from the others, its connection broken) lets its
// held jobs go back to QUEUE, and sends back what it pulls, until the store
// answers again: another admission process that can reserve takes them,
// rather than one sick process holding them for as long as it lives. A
// job it let go that it had dispatched after all is dropped by DISPATCH's
// duplicate window, or found done in its operation record.
const LetGoAfter = 10 * time.Second

// checkStore, on every tick: a process whose store has failed for
// LetGoAfter, and lately (held jobs are retried every second, so a failure
// that is not recent is no outage), lets its jobs go; one letting go asks
// the store once a second whether it is back.
func (o *outage) checkStore(ctx context.Context) {
	now := o.now()
	if !o.lettingGo {
		if o.downSince.IsZero() || now.Sub(o.downSince) < o.letGo || now.Sub(o.downLast) >= 3*time.Second {
			return
		}
		o.lettingGo = true
		o.log.Warn("budget store out of reach; letting held jobs go to other admission processes", "held", o.holder.held.n, "since", o.downSince)
		o.holder.letGoAll()
		return
	}
	if now.Sub(o.downLast) < time.Second {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := o.mesh.Budgets.Get(pctx, "probe"); err == nil || errors.Is(err, jetstream.ErrKeyNotFound) {
		o.storeUp()
		return
	}
	o.downLast = now
}
