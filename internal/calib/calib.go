// Package calib keeps, per model, how the provider's reported prompt tokens
// compare with Sluice's estimates. Executors record the ratio from usage and
// publish it to the budgets bucket (at most every PublishEvery per model);
// ingest reads it (cached for CacheFor) and scales estimates up when they
// ran low, so reservations cover what providers charge. Estimates that ran
// high are left alone: over-reserving costs some throughput, under-reserving
// costs 429s.
package calib

import (
	"context"
	"encoding/json"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Tunables.
const (
	Alpha        = 0.05 // EWMA weight of one sample
	PublishEvery = 10 * time.Second
	CacheFor     = 10 * time.Second
	MaxRatio     = 3.0 // a calibration never scales an estimate beyond this
)

// Record is what the bucket holds per model.
type Record struct {
	Ratio   float64   `json:"ratio"` // actual / estimated prompt tokens, smoothed
	Samples int64     `json:"samples"`
	At      time.Time `json:"at"`
}

type entry struct {
	Record
	published time.Time
	fetched   time.Time
}

// Table is one process's view.
type Table struct {
	kv  jetstream.KeyValue
	now func() time.Time
	mu  sync.Mutex
	m   map[string]*entry
}

// New makes a table over the budgets bucket; now may be nil.
func New(kv jetstream.KeyValue, now func() time.Time) *Table {
	if now == nil {
		now = time.Now
	}
	return &Table{kv: kv, now: now, m: map[string]*entry{}}
}

// Observe folds one call's usage into key's ratio and returns the new ratio.
// It publishes the ratio when it is due.
func (t *Table) Observe(ctx context.Context, key string, estimated, actual int) float64 {
	if estimated <= 0 || actual <= 0 {
		return 0
	}
	r := float64(actual) / float64(estimated)
	t.mu.Lock()
	e, ok := t.m[key]
	if !ok {
		e = &entry{Record: Record{Ratio: r}}
		t.m[key] = e
	} else {
		e.Ratio = (1-Alpha)*e.Ratio + Alpha*r
	}
	e.Samples++
	now := t.now()
	due := now.Sub(e.published) >= PublishEvery
	if due {
		e.published = now
	}
	rec := e.Record
	rec.At = now.UTC()
	t.mu.Unlock()
	if due && t.kv != nil {
		data, _ := json.Marshal(rec)
		_, _ = t.kv.Put(ctx, key, data) // last writer wins: each executor's view is a fair sample
	}
	return rec.Ratio
}

// Factor returns the multiplier for key's estimates: the calibrated ratio
// when estimates ran low, else 1.
func (t *Table) Factor(ctx context.Context, key string) float64 {
	now := t.now()
	t.mu.Lock()
	e, ok := t.m[key]
	if !ok {
		e = &entry{Record: Record{Ratio: 1}}
		t.m[key] = e
	}
	stale := t.kv != nil && now.Sub(e.fetched) >= CacheFor
	if stale {
		e.fetched = now
	}
	t.mu.Unlock()
	if stale {
		var rec Record
		if got, err := t.kv.Get(ctx, key); err == nil && json.Unmarshal(got.Value(), &rec) == nil {
			t.mu.Lock()
			e.Record = rec
			t.mu.Unlock()
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.Ratio <= 1 || e.Samples < 20 {
		return 1
	}
	return math.Min(e.Ratio, MaxRatio)
}
