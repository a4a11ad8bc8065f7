package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
)

// Concurrency is shared by leases. The key (ConcKey) holds, per holder (one
// executor process), how many call slots it leased and until when. A holder
// renews its lease every third of the period with one compare-and-set,
// sized to what it used at the peak since the last renewal plus a quarter
// spare (so a call arriving during a burst finds a slot without waiting
// for a renewal): it may grow while slots are free, and when holders
// compete each is capped at an equal share, so the others can grow too. The
// unexpired leases never add up to more than the limit; a holder that dies
// keeps its slots only until its lease expires. Calls take and give back
// slots locally: no KV round trip per call.

// SlotLease is one holder's entry.
type SlotLease struct {
	N       int   `json:"n"`
	Expires int64 `json:"exp"` // unix nanoseconds
	Want    int   `json:"want"`
}

type slotState struct {
	Holders map[string]SlotLease `json:"h"`
}

// ConcKey is the budgets key of a provider/model's concurrency.
func ConcKey(provider, modelToken string) string { return keys.Conc(provider, modelToken) }

// Pool is one holder's view of a concurrency lease.
type Pool struct {
	kv     KV
	key    string
	holder string
	limit  int
	period time.Duration
	now    func() time.Time

	mu      sync.Mutex
	held    int       // slots leased
	inUse   int       // slots taken by calls
	peak    int       // most slots in use since the last renew
	waiting int       // callers that found no free slot since the last renew
	expires time.Time // lease end; zero when none
	changed chan struct{}
	demand  chan struct{} // a caller found no free slot: renew early
}

// NewPool makes a pool for holder; now may be nil for time.Now.
func NewPool(kv KV, key, holder string, limit int, period time.Duration, now func() time.Time) *Pool {
	if now == nil {
		now = time.Now
	}
	return &Pool{kv: kv, key: key, holder: holder, limit: limit, period: period, now: now,
		changed: make(chan struct{}), demand: make(chan struct{}, 1)}
}

// SetLimit changes the fleet-wide limit (a reload); the next renewal
// leases under it, and slots in use above a lowered limit are given back
// as their calls end.
func (p *Pool) SetLimit(limit int) {
	p.mu.Lock()
	p.limit = limit
	p.mu.Unlock()
}

// TryAcquire takes a slot if the lease has a free one and has not expired.
func (p *Pool) TryAcquire() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inUse < p.usableLocked() {
		p.inUse++
		p.peak = max(p.peak, p.inUse)
		return true
	}
	p.waiting++
	p.askLocked()
	return false
}

func (p *Pool) askLocked() {
	select {
	case p.demand <- struct{}{}:
	default:
	}
}

// usableLocked is how many slots may be in use: none once the lease expired.
func (p *Pool) usableLocked() int {
	if p.expires.IsZero() || !p.now().Before(p.expires) {
		return 0
	}
	return p.held
}

// Acquire waits for a slot until ctx ends.
func (p *Pool) Acquire(ctx context.Context) error {
	for {
		p.mu.Lock()
		if p.inUse < p.usableLocked() {
			p.inUse++
			p.peak = max(p.peak, p.inUse)
			p.mu.Unlock()
			return nil
		}
		p.waiting++
		p.askLocked()
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Release gives a slot back.
func (p *Pool) Release() {
	p.mu.Lock()
	if p.inUse > 0 {
		p.inUse--
	}
	p.signalLocked()
	p.mu.Unlock()
}

func (p *Pool) signalLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Held returns the slots leased and in use.
func (p *Pool) Held() (held, inUse int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.usableLocked(), p.inUse
}

// Renew takes or adjusts the lease with one compare-and-set. Callers run it
// every period/3 (Run does).
func (p *Pool) Renew(ctx context.Context) error {
	p.mu.Lock()
	want := max(p.inUse+p.waiting, p.peak)
	if p.waiting > 0 {
		want = max(want, 2*p.inUse, 1)
	}
	want += want / 4
	limit := p.limit
	want = min(max(want, p.inUse, 1), limit)
	p.waiting, p.peak = 0, p.inUse
	p.mu.Unlock()

	b := backoff{sleep: sleepCtx, now: p.now}
	for {
		st, rev, err := p.load(ctx)
		if err != nil {
			return err
		}
		now := p.now()
		others, active := 0, 1
		for h, l := range st.Holders {
			if l.Expires <= now.UnixNano() {
				delete(st.Holders, h) // a dead holder's slots come back at expiry
				continue
			}
			if h == p.holder {
				continue
			}
			others += l.N
			if l.Want > 0 {
				active++
			}
		}
		p.mu.Lock()
		inUse := p.inUse
		p.mu.Unlock()
		fair := int(math.Ceil(float64(limit) / float64(active)))
		grant := min(want, max(fair, inUse), limit-others)
		grant = max(grant, 0)
		exp := now.Add(p.period)
		if grant == 0 && want == 0 {
			delete(st.Holders, p.holder)
		} else {
			st.Holders[p.holder] = SlotLease{N: grant, Expires: exp.UnixNano(), Want: want}
		}
		err = p.store(ctx, st, rev)
		if errors.Is(err, errConflict) {
			if err := b.wait(ctx, "lease", p.key); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.held, p.expires = grant, exp
		p.signalLocked()
		p.mu.Unlock()
		return nil
	}
}

// Return gives the whole lease back (shutdown).
func (p *Pool) Return(ctx context.Context) error {
	b := backoff{sleep: sleepCtx, now: p.now}
	for {
		st, rev, err := p.load(ctx)
		if err != nil {
			return err
		}
		if _, ok := st.Holders[p.holder]; !ok {
			break
		}
		delete(st.Holders, p.holder)
		err = p.store(ctx, st, rev)
		if errors.Is(err, errConflict) {
			if err := b.wait(ctx, "return lease", p.key); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	p.mu.Lock()
	p.held, p.expires = 0, time.Time{}
	p.signalLocked()
	p.mu.Unlock()
	return nil
}

// MinRenewInterval bounds how often demand triggers an early renewal.
const MinRenewInterval = 100 * time.Millisecond

// Run renews the lease every period/3, and sooner (at most every
// MinRenewInterval) when callers wait for a slot, until ctx ends; then it
// returns the lease. Renewal failures leave the lease to expire: no slots
// without a lease (fail closed). onErr may be nil.
func (p *Pool) Run(ctx context.Context, onErr func(error)) {
	tick := p.period / 3
	for {
		last := time.Now()
		if err := p.Renew(ctx); err != nil && ctx.Err() == nil && onErr != nil {
			onErr(err)
		}
		timer := time.NewTimer(tick)
		select {
		case <-ctx.Done():
			timer.Stop()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = p.Return(rctx)
			cancel()
			return
		case <-timer.C:
		case <-p.demand:
			timer.Stop()
			// Renew now, unless the last renewal was very recent.
			if wait := MinRenewInterval - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
			}
		}
	}
}

func (p *Pool) load(ctx context.Context) (slotState, uint64, error) {
	st := slotState{Holders: map[string]SlotLease{}}
	e, err := p.kv.Get(ctx, p.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return st, 0, nil
	}
	if err != nil {
		return st, 0, fmt.Errorf("%w: get %s: %v", ErrUnavailable, p.key, err)
	}
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return st, 0, fmt.Errorf("lease %s: corrupt: %w", p.key, err)
	}
	if st.Holders == nil {
		st.Holders = map[string]SlotLease{}
	}
	return st, e.Revision(), nil
}

func (p *Pool) store(ctx context.Context, st slotState, rev uint64) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = p.kv.Create(ctx, p.key, data)
	} else {
		_, err = p.kv.Update(ctx, p.key, data, rev)
	}
	if IsConflict(err) {
		return errConflict
	}
	if err != nil {
		return fmt.Errorf("%w: write %s: %v", ErrUnavailable, p.key, err)
	}
	return nil
}
