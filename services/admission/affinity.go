package admission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// # Cache affinity
//
// A job's affinity key (task.Task.Affinity: a conversation) keeps it on the
// deployment of its model's group that served the key last, for
// admission.cache_affinity.ttl after that job, so the provider's prompt
// cache serves the conversation's prefix: unless another deployment would
// send it more than max_delay sooner, or that deployment takes nothing now.
// The fleet shares where each key was served: one record per tenant and
// model in the budgets bucket (keys.Affinity), a map of the keys' hashes
// (never the keys) to their deployment and expiry, at most
// MaxAffinityKeys entries. Admission reads a record at most every
// affinityRefresh and writes what it placed in the background, batched.

// MaxAffinityKeys bounds one record's entries; past it the ones closest to
// expiry are dropped (a dropped key is placed as a new one: safe).
const MaxAffinityKeys = 1024

// affinityRefresh is how often a record is read again; affinityWait bounds
// a read on the scheduler's way.
const (
	affinityRefresh = 250 * time.Millisecond
	affinityWait    = 200 * time.Millisecond
)

// affEntry is where one key was last served, until when (unix ms).
type affEntry struct {
	P string `json:"p"`
	E int64  `json:"e"`
}

type affView struct {
	set  map[string]affEntry
	read time.Time
}

// affinityTable is this process's view of the fleet's affinity records.
type affinityTable struct {
	kv            budget.KV
	now           func() time.Time
	ttl, maxDelay time.Duration
	jobs          *prometheus.CounterVec // model, outcome

	mu    sync.Mutex
	views map[string]affView             // record key -> view
	dirty map[string]map[string]affEntry // record key -> entries to write
	// writing are the entries flush is writing (record key -> entries):
	// until the write lands, a read of the record does not show them.
	writing map[string]map[string]affEntry
	wrote   map[string]map[string]time.Time // record key -> hash -> last noted for writing
	kick    chan struct{}
}

func newAffinityTable(kv budget.KV, now func() time.Time, ttl, maxDelay time.Duration, jobs *prometheus.CounterVec) *affinityTable {
	return &affinityTable{kv: kv, now: now, ttl: ttl, maxDelay: maxDelay, jobs: jobs,
		views: map[string]affView{}, dirty: map[string]map[string]affEntry{}, writing: map[string]map[string]affEntry{},
		wrote: map[string]map[string]time.Time{}, kick: make(chan struct{}, 1)}
}

func affinityHash(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:12])
}

func affinityRecord(j *task.Task) string { return keys.Affinity(j.Tenant, job.ModelToken(j.Model)) }

// stay returns the provider j's key was last served by ("" for none or an
// expired one); when that deployment is in order and would send j at most
// maxDelay after the best, it moves to the front of order.
func (a *affinityTable) stay(ctx context.Context, j *task.Task, order []*modelState, now time.Time) string {
	e, ok := a.lookup(ctx, affinityRecord(j), affinityHash(j.Affinity), now)
	if !ok {
		return ""
	}
	for i, ms := range order {
		if ms.provider != e.P {
			continue
		}
		if i > 0 && ms.expected(now).Sub(order[0].expected(now)) <= a.maxDelay {
			copy(order[1:i+1], order[:i])
			order[0] = ms
		}
		break
	}
	return e.P
}

// placed notes that j went to provider (prev: where its key was, "" for a
// new key), counts whether it stayed, and has the record written.
func (a *affinityTable) placed(j *task.Task, provider, prev string) {
	outcome := "new"
	switch {
	case prev == provider:
		outcome = "stayed"
	case prev != "":
		outcome = "moved"
	}
	a.jobs.WithLabelValues(j.Model, outcome).Inc()
	rec, h := affinityRecord(j), affinityHash(j.Affinity)
	now := a.now()
	e := affEntry{P: provider, E: now.Add(a.ttl).UnixMilli()}
	a.mu.Lock()
	defer a.mu.Unlock()
	if v, ok := a.views[rec]; ok {
		v.set[h] = e
	}
	w := a.wrote[rec]
	if w == nil {
		w = map[string]time.Time{}
		a.wrote[rec] = w
	}
	// The same key on the same deployment is written again only when a
	// quarter of its lifetime has passed.
	if outcome == "stayed" && now.Sub(w[h]) < a.ttl/4 {
		return
	}
	w[h] = now
	d := a.dirty[rec]
	if d == nil {
		d = map[string]affEntry{}
		a.dirty[rec] = d
	}
	d[h] = e
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// lookup returns hash's entry in rec, reading the record again when this
// process's view is older than affinityRefresh. A record it cannot read
// holds nothing (the job is placed as a new key).
func (a *affinityTable) lookup(ctx context.Context, rec, hash string, now time.Time) (affEntry, bool) {
	a.mu.Lock()
	v, ok := a.views[rec]
	a.mu.Unlock()
	if !ok || now.Sub(v.read) >= affinityRefresh {
		rctx, cancel := context.WithTimeout(ctx, affinityWait)
		set, _, err := a.load(rctx, rec)
		cancel()
		if err != nil {
			// Unread: what this process saw last stands (a slow store
			// must not scatter conversations), read again next time.
			set = v.set
			if set == nil {
				set = map[string]affEntry{}
			}
		}
		a.mu.Lock()
		for _, pending := range []map[string]affEntry{a.writing[rec], a.dirty[rec]} {
			for h, e := range pending {
				set[h] = e // not written yet: this process's word is the newest
			}
		}
		v = affView{set: set, read: now}
		a.views[rec] = v
		a.mu.Unlock()
	}
	a.mu.Lock()
	e, ok := v.set[hash]
	a.mu.Unlock()
	return e, ok && e.E > now.UnixMilli()
}

// run writes what placed noted, batched, until ctx ends.
func (a *affinityTable) run(ctx context.Context) {
	t := time.NewTicker(affinityRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			a.flush(context.WithoutCancel(ctx))
			return
		case <-t.C:
		case <-a.kick:
		}
		a.flush(ctx)
		a.forget()
	}
}

// flush writes every record with entries to write.
func (a *affinityTable) flush(ctx context.Context) {
	a.mu.Lock()
	dirty := a.dirty
	a.dirty = map[string]map[string]affEntry{}
	maps.Copy(a.writing, dirty)
	a.mu.Unlock()
	for rec, entries := range dirty {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		err := a.write(wctx, rec, entries)
		cancel()
		a.mu.Lock()
		delete(a.writing, rec)
		if err != nil && ctx.Err() == nil && a.dirty[rec] == nil {
			a.dirty[rec] = entries // next time
		}
		a.mu.Unlock()
	}
}

// forget drops what no longer matters: views not read lately, and write
// marks older than the lifetime.
func (a *affinityTable) forget() {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for rec, v := range a.views {
		if now.Sub(v.read) > time.Minute {
			delete(a.views, rec)
		}
	}
	for rec, w := range a.wrote {
		for h, at := range w {
			if now.Sub(at) > a.ttl {
				delete(w, h)
			}
		}
		if len(w) == 0 {
			delete(a.wrote, rec)
		}
	}
}

// write merges entries into rec by compare-and-set, dropping expired
// entries and keeping the MaxAffinityKeys that expire last.
func (a *affinityTable) write(ctx context.Context, rec string, entries map[string]affEntry) error {
	for range 10 {
		set, rev, err := a.load(ctx, rec)
		if err != nil {
			return err
		}
		now := a.now().UnixMilli()
		for h, e := range set {
			if e.E <= now {
				delete(set, h)
			}
		}
		for h, e := range entries {
			set[h] = e
		}
		budget.TrimMap(set, MaxAffinityKeys, func(e affEntry) int64 { return e.E })
		data, _ := json.Marshal(set)
		if rev == 0 {
			_, err = a.kv.Create(ctx, rec, data)
		} else {
			_, err = a.kv.Update(ctx, rec, data, rev)
		}
		if !budget.IsConflict(err) {
			return err
		}
	}
	return errors.New("affinity record: too many conflicts")
}

func (a *affinityTable) load(ctx context.Context, rec string) (map[string]affEntry, uint64, error) {
	return budget.LoadMap[affEntry](ctx, a.kv, rec)
}
