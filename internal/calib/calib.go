// Package calib learns, per provider/model and request shape, how the
// provider's reported prompt tokens compare with Sluice's estimates, and
// gives admission the correction to apply when it places a job.
//
// Every answer that reports usage is a sample, actual/estimated prompt
// tokens. Executors merge their samples into one record per key in the
// budgets bucket (compare-and-set: the last Window samples of the whole
// fleet, at once while a key is still learning, at most every FlushEvery
// after), so every process sees the fleet's samples and a restarted fleet
// starts from them. The correction is a high quantile (Quantile) of the
// window: one answer moves it, in either direction, and an estimate that
// runs high is corrected down as one that runs low is corrected up. Before
// a key has any answer, its correction is Prior: the first calls of a
// backlog go out with room to spare.
//
// Keys: a model's record ("calib.<provider>.<model>") holds every sample
// of the model; each shape class (package tokens: size, script, tools,
// images) has its own ("calib.<provider>.<model>.<class>"). A class with
// fewer than ClassSamples samples uses the larger of its own correction and
// the model's.
package calib

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
)

// Tunables.
const (
	Window       = 32  // samples kept per key, the fleet's most recent
	Quantile     = 0.9 // of actual/estimated over the window
	Prior        = 1.25
	MinRatio     = 0.25 // a correction never scales an estimate below this
	MaxRatio     = 3.0  // nor above this
	ClassSamples = 3
	FlushEvery   = time.Second
	CacheFor     = time.Second
)

// Placed is the prompt tokens an estimate of prompt tokens reserves at
// correction f (clamped to [MinRatio, MaxRatio]): the one rule admission
// places a prompt by. Everything that checks or settles a reservation
// works in these units, never in the raw estimate's: PlacedRange bounds
// them for the guard.
func Placed(prompt int, f float64) int {
	if f == 1 {
		return prompt
	}
	return int(math.Ceil(float64(prompt) * min(max(f, MinRatio), MaxRatio)))
}

// PlacedRange is the least and the most Placed can make of prompt.
func PlacedRange(prompt int) (lo, hi int) {
	return Placed(prompt, MinRatio), Placed(prompt, MaxRatio)
}

// Record is what the bucket holds per key.
type Record struct {
	// Ratios are the most recent samples, actual/estimated, oldest first.
	Ratios []float64 `json:"ratios"`
	// Samples counts every sample ever merged.
	Samples int64     `json:"samples"`
	At      time.Time `json:"at"`
}

// Correction is the record's multiplier for estimates: the Quantile of its
// window, clamped to [MinRatio, MaxRatio]; Prior when it has no sample.
func (r Record) Correction() float64 {
	if len(r.Ratios) == 0 {
		return Prior
	}
	s := slices.Clone(r.Ratios[max(len(r.Ratios)-Window, 0):]) // whoever wrote the record
	slices.Sort(s)
	i := int(math.Ceil(Quantile*float64(len(s)))) - 1
	return min(max(s[max(i, 0)], MinRatio), MaxRatio)
}

type entry struct {
	rec     Record
	rev     uint64
	fetched time.Time
	flushed time.Time
	pending []float64
	// corr is rec's Correction once asked for (corrOK): admission asks
	// for it at every job, and it sorts the window.
	corr   float64
	corrOK bool
}

// set replaces the entry's record.
func (e *entry) set(rec Record) { e.rec, e.corrOK = rec, false }

// correction is e.rec.Correction(), computed once per record.
func (e *entry) correction() float64 {
	if !e.corrOK {
		e.corr, e.corrOK = e.rec.Correction(), true
	}
	return e.corr
}

// Table is one process's view of the fleet's records.
type Table struct {
	kv  jetstream.KeyValue
	now func() time.Time
	mu  sync.Mutex
	m   map[string]*entry
	// flushing serialises flushes per key within the process.
	flushing sync.Map
}

// New makes a table over the budgets bucket (nil: this process alone);
// now may be nil.
func New(kv jetstream.KeyValue, now func() time.Time) *Table {
	if now == nil {
		now = time.Now
	}
	return &Table{kv: kv, now: now, m: map[string]*entry{}}
}

// key is the budgets key of a provider/model ("" class) or of one of its
// request shape classes.
func key(provider, modelToken, class string) string {
	return keys.Calib(provider, modelToken, class)
}

// Observe records one answer: estimated prompt tokens (Sluice's own count,
// before any correction) against the actual count the provider reported,
// for the model and for its class. It returns the model's correction.
func (t *Table) Observe(ctx context.Context, provider, modelToken, class string, estimated, actual int) float64 {
	if estimated <= 0 || actual <= 0 {
		return 0
	}
	r := float64(actual) / float64(estimated)
	keys := []string{key(provider, modelToken, "")}
	if class != "" {
		keys = append(keys, key(provider, modelToken, class))
	}
	for _, k := range keys {
		t.mu.Lock()
		e := t.entry(k)
		e.pending = append(e.pending, r)
		if len(e.pending) > Window {
			e.pending = e.pending[len(e.pending)-Window:]
		}
		now := t.now()
		due := t.kv == nil || e.rec.Samples < Window || now.Sub(e.flushed) >= FlushEvery
		t.mu.Unlock()
		if due {
			t.flush(ctx, k)
		}
	}
	return t.correction(ctx, keys[0])
}

func (t *Table) entry(k string) *entry {
	e, ok := t.m[k]
	if !ok {
		e = &entry{}
		t.m[k] = e
	}
	return e
}

// merge appends ratios to rec's window.
func merge(rec Record, ratios []float64, at time.Time) Record {
	rec.Ratios = append(slices.Clone(rec.Ratios), ratios...)
	if len(rec.Ratios) > Window {
		rec.Ratios = rec.Ratios[len(rec.Ratios)-Window:]
	}
	rec.Samples += int64(len(ratios))
	rec.At = at.UTC()
	return rec
}

// flush merges k's pending samples into the fleet's record.
func (t *Table) flush(ctx context.Context, k string) {
	busy, _ := t.flushing.LoadOrStore(k, new(sync.Mutex))
	mu := busy.(*sync.Mutex)
	if !mu.TryLock() {
		return // another goroutine flushes k; the samples wait for the next
	}
	defer mu.Unlock()
	t.mu.Lock()
	e := t.entry(k)
	pending := e.pending
	e.pending = nil
	e.flushed = t.now()
	if t.kv == nil {
		e.set(merge(e.rec, pending, t.now()))
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	for range 4 {
		var rec Record
		var rev uint64
		got, err := t.kv.Get(ctx, k)
		switch {
		case err == nil:
			rev = got.Revision()
			if json.Unmarshal(got.Value(), &rec) != nil {
				rec = Record{}
			}
		case errors.Is(err, jetstream.ErrKeyNotFound):
		default:
			return
		}
		rec = merge(rec, pending, t.now())
		data, _ := json.Marshal(rec)
		if rev == 0 {
			rev, err = t.kv.Create(ctx, k, data)
		} else {
			rev, err = t.kv.Update(ctx, k, data, rev)
		}
		if err == nil {
			t.mu.Lock()
			e.set(rec)
			e.rev, e.fetched = rev, t.now()
			t.mu.Unlock()
			return
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return
		}
	}
}

// record returns k's record and its Correction, read again from the
// bucket when older than CacheFor.
func (t *Table) record(ctx context.Context, k string) (Record, float64) {
	return t.recordWithin(ctx, 0, k)
}

// recordWithin is record with the bucket's read bounded by wait as well
// (0: by ctx alone): the bound's timer is made only when the bucket is
// read, at most once per key per CacheFor, not at every call.
func (t *Table) recordWithin(ctx context.Context, wait time.Duration, k string) (Record, float64) {
	now := t.now()
	t.mu.Lock()
	e := t.entry(k)
	stale := t.kv != nil && now.Sub(e.fetched) >= CacheFor
	if stale {
		e.fetched = now
	}
	rec, corr := e.rec, e.correction()
	t.mu.Unlock()
	if !stale {
		return rec, corr
	}
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	got, err := t.kv.Get(ctx, k)
	if err != nil {
		return rec, corr
	}
	var fresh Record
	if json.Unmarshal(got.Value(), &fresh) != nil {
		return rec, corr
	}
	t.mu.Lock()
	if got.Revision() >= e.rev {
		e.set(fresh)
		e.rev = got.Revision()
	}
	rec, corr = e.rec, e.correction()
	t.mu.Unlock()
	return rec, corr
}

func (t *Table) correction(ctx context.Context, k string) float64 {
	_, corr := t.record(ctx, k)
	return corr
}

// Factor is the multiplier admission applies to a job's prompt estimate:
// its class's correction once the class has ClassSamples samples, before
// that the larger of the class's and the model's (Prior for a model with
// no answer yet). wait bounds a read of the bucket beside ctx (0: ctx
// alone).
func (t *Table) Factor(ctx context.Context, wait time.Duration, provider, modelToken, class string) float64 {
	_, model := t.recordWithin(ctx, wait, key(provider, modelToken, ""))
	if class == "" {
		return model
	}
	c, corr := t.recordWithin(ctx, wait, key(provider, modelToken, class))
	switch {
	case c.Samples >= ClassSamples:
		return corr
	case c.Samples > 0:
		return max(corr, model)
	}
	return model
}

// State is a key's learned state, for display.
type State struct {
	Correction float64
	Samples    int64
	At         time.Time
}

// Lookup returns provider/model's state and its classes' (by class name),
// read from the bucket.
func (t *Table) Lookup(ctx context.Context, provider, modelToken string) (State, map[string]State) {
	rec, corr := t.record(ctx, key(provider, modelToken, ""))
	model := State{Correction: corr, Samples: rec.Samples, At: rec.At}
	classes := map[string]State{}
	if t.kv == nil {
		return model, classes
	}
	prefix := key(provider, modelToken, "") + "."
	lister, err := t.kv.ListKeysFiltered(ctx, prefix+">")
	if err != nil {
		return model, classes
	}
	for k := range lister.Keys() {
		r, corr := t.record(ctx, k)
		classes[k[len(prefix):]] = State{Correction: corr, Samples: r.Samples, At: r.At}
	}
	return model, classes
}
