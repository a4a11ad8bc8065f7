package promptcache

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/keys"
)

// Bounds and pacing of the registry.
const (
	// MaxEntries bounds the prefixes one model's record keeps; past it the
	// ones closest to expiry are dropped (a dropped prefix is reserved in
	// full: safe).
	MaxEntries = 256
	// Refresh is how often a reader reads a model's record again.
	Refresh = 250 * time.Millisecond
	// RecordEvery is how often one process writes the same prefix again:
	// the provider refreshes an entry's TTL on every read, the registry
	// at most this often (so it may think an entry expires this much
	// before the provider does: safe).
	RecordEvery = 15 * time.Second
)

// Entry is a prefix the provider holds in its cache.
type Entry struct {
	// Expires is when the provider drops it if nothing reads it (unix ms).
	Expires int64 `json:"e"`
	// Tokens is what the provider last reported reading or writing for
	// the request (cache_read_input_tokens + cache_creation_input_tokens).
	Tokens int `json:"t"`
}

// Key is the budgets key of a provider/model's record.
func Key(provider, modelToken string) string { return keys.PromptCache(provider, modelToken) }

// Registry is the fleet's view of warm prefixes: one record per
// provider/model in the budgets bucket (a map of prefix hash to Entry,
// at most MaxEntries), written by executors when the provider reports a
// cache read or write, read by admission at most every Refresh.
type Registry struct {
	kv  budget.KV
	now func() time.Time

	mu      sync.Mutex
	views   map[string]view
	written map[string]time.Time // key+hash → last write by this process
}

type view struct {
	set  map[string]Entry
	read time.Time
}

// New makes a registry over kv; now may be nil for time.Now.
func New(kv budget.KV, now func() time.Time) *Registry {
	if now == nil {
		now = time.Now
	}
	return &Registry{kv: kv, now: now, views: map[string]view{}, written: map[string]time.Time{}}
}

// Warm reports whether the prefix hash is in key's record and not expired,
// reading the record again when this process's view is older than Refresh.
// A store it cannot reach reads as cold (the request is reserved in full).
func (r *Registry) Warm(ctx context.Context, key, hash string) (Entry, bool) {
	now := r.now()
	r.mu.Lock()
	v, ok := r.views[key]
	r.mu.Unlock()
	if !ok || now.Sub(v.read) >= Refresh {
		set, _, err := r.load(ctx, key)
		if err != nil {
			set = nil
		}
		v = view{set: set, read: now}
		r.mu.Lock()
		r.views[key] = v
		r.mu.Unlock()
	}
	e, ok := v.set[hash]
	if !ok || e.Expires <= now.UnixMilli() {
		return Entry{}, false
	}
	return e, true
}

// Record notes that the provider read or wrote the prefix hash now (tokens
// as it reported them), so it stays warm for ttl. The same prefix is
// written at most every RecordEvery by one process.
func (r *Registry) Record(ctx context.Context, key, hash string, tokens int, ttl time.Duration) error {
	now := r.now()
	id := key + "/" + hash
	r.mu.Lock()
	if now.Sub(r.written[id]) < RecordEvery {
		r.mu.Unlock()
		return nil
	}
	r.written[id] = now
	for k, at := range r.written {
		if now.Sub(at) >= RecordEvery {
			delete(r.written, k)
		}
	}
	r.mu.Unlock()
	exp := now.Add(ttl).UnixMilli()
	for range 20 {
		set, rev, err := r.load(ctx, key)
		if err != nil {
			return err
		}
		for h, e := range set {
			if e.Expires <= now.UnixMilli() {
				delete(set, h)
			}
		}
		set[hash] = Entry{Expires: max(exp, set[hash].Expires), Tokens: tokens}
		budget.TrimMap(set, MaxEntries, func(e Entry) int64 { return e.Expires })
		data, _ := json.Marshal(set)
		if rev == 0 {
			_, err = r.kv.Create(ctx, key, data)
		} else {
			_, err = r.kv.Update(ctx, key, data, rev)
		}
		if budget.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: write %s: %v", budget.ErrUnavailable, key, err)
		}
		return nil
	}
	return fmt.Errorf("%w: %s: too many conflicts", budget.ErrUnavailable, key)
}

func (r *Registry) load(ctx context.Context, key string) (map[string]Entry, uint64, error) {
	return budget.LoadMap[Entry](ctx, r.kv, key)
}
