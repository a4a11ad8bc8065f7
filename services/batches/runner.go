package batches

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Runner settings.
const (
	// Tick is how often the runner looks for open batches to claim, and a
	// driver reads its batch's jobs.
	Tick = 500 * time.Millisecond
	// LeaseTTL is how long a claim on a batch holds without renewal: a
	// process that dies holding a batch loses it to another this long
	// after.
	LeaseTTL = 30 * time.Second
	// checkpointLines: a driver records its progress at least every so
	// many lines submitted (and every second).
	checkpointLines = 200
	// maxLookups bounds the job records a driver reads per tick.
	maxLookups = 2000
)

// errLost ends a driver whose batch another runner holds now.
var errLost = errors.New("the batch's lease is held by another runner")

// runner claims open batches and drives each it holds.
type runner struct {
	*deps
	files *files
	wake  chan struct{}

	mu      sync.Mutex
	running map[string]bool      // batch keys driven here
	retry   map[string]time.Time // a batch whose driver failed waits until then
	wg      sync.WaitGroup
}

// RetryAfter is how long a batch whose driver stopped on an error waits
// before this runner drives it again (logged each time).
const RetryAfter = 5 * time.Second

func newRunner(d *deps) *runner {
	return &runner{deps: d, files: &files{deps: d}, wake: make(chan struct{}, 1), running: map[string]bool{}, retry: map[string]time.Time{}}
}

// poke has the runner look for open batches now.
func (r *runner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// run looks for open batches every Tick (or when poked) until ctx ends,
// then waits for its drivers.
func (r *runner) run(ctx context.Context) error {
	t := time.NewTicker(Tick)
	defer t.Stop()
	defer r.wg.Wait()
	for {
		r.scan(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-r.wake:
		}
	}
}

// scan claims the open batches no live runner holds, and drives them.
func (r *runner) scan(ctx context.Context) {
	kv, _, err := r.stores(ctx)
	if err != nil {
		r.log.Debug("batches: stores not bound yet", "err", err)
		return
	}
	l, err := kv.ListKeysFiltered(ctx, "open.>")
	if err != nil {
		r.log.Warn("batches: list open batches", "err", err)
		return
	}
	for k := range l.Keys() {
		parts := strings.SplitN(k, ".", 3)
		if len(parts) != 3 || !job.ValidName(parts[1]) || !batchIDRE.MatchString(parts[2]) {
			continue
		}
		tenant, id := parts[1], parts[2]
		r.mu.Lock()
		busy := r.running[k] || r.now().Before(r.retry[k])
		if !busy {
			delete(r.retry, k)
		}
		r.mu.Unlock()
		if busy || !r.claim(ctx, kv, tenant, id) {
			continue
		}
		r.start(ctx, kv, k, tenant, id)
	}
}

// start drives tenant's batch id (key k, claimed) until it ends, its
// lease is lost or ctx ends; a driver that fails leaves it for RetryAfter.
func (r *runner) start(ctx context.Context, kv jetstream.KeyValue, k, tenant, id string) {
	r.mu.Lock()
	r.running[k] = true
	r.mu.Unlock()
	r.wg.Go(func() {
		defer func() {
			r.mu.Lock()
			delete(r.running, k)
			r.mu.Unlock()
		}()
		d := &driver{runner: r, kv: kv, tenant: tenant, id: id}
		err := d.run(ctx)
		switch {
		case errors.Is(err, errLost):
			r.log.Info("batch: another runner holds it now", "batch_id", id, "tenant", tenant)
		case err != nil && ctx.Err() == nil:
			r.log.Warn("batch: driver stopped; driven again later", "batch_id", id, "tenant", tenant, "retry_after", RetryAfter, "err", err)
			r.mu.Lock()
			r.retry[k] = r.now().Add(RetryAfter)
			r.mu.Unlock()
		}
	})
}

// claim takes tenant's batch id for this runner when no other holds it;
// an ended batch loses its open key.
func (r *runner) claim(ctx context.Context, kv jetstream.KeyValue, tenant, id string) bool {
	now := r.now()
	gone := false
	b, err := updateBatch(ctx, kv, tenant, id, func(b *batchRecord) bool {
		if b.ended() {
			gone = true
			return false
		}
		if b.Owner != r.cfg.Holder && b.LeaseUntil > now.UnixMilli() {
			return false
		}
		b.Owner, b.LeaseUntil = r.cfg.Holder, now.Add(LeaseTTL).UnixMilli()
		return true
	})
	if errors.Is(err, job.ErrNotFound) || gone {
		_ = kv.Delete(ctx, openKey(tenant, id))
		return false
	}
	return err == nil && b.Owner == r.cfg.Holder
}
