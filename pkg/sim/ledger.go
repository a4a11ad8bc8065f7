package sim

import (
	"sync"
	"sync/atomic"
	"time"
)

// generation is everything Reset clears. A request loads the current
// generation once and records into it, so a Reset never races with, or is
// polluted by, requests still in flight.
type generation struct {
	started time.Time
	models  map[string]*modelState // fixed at creation
	status  statusCounts

	completed, replayed, duplicates atomic.Int64
	clientGone, connResets, hangs   atomic.Int64
	faultSeq                        atomic.Uint64
	faults                          atomic.Int64 // faults injected (Faults.MaxFaults)
	streamCuts, streamStalls        atomic.Int64
	streamed                        atomic.Int64

	mu      sync.Mutex
	ledger  map[string]*entry // by Idempotency-Key
	keyDone map[string]int64  // completions by Idempotency-Key
	jobDone map[string]int64  // completions by X-Sluice-Job-Id
}

func newGeneration(now time.Time, cfg Config) *generation {
	g := &generation{
		started: now,
		models:  make(map[string]*modelState, len(cfg.Models)),
		ledger:  map[string]*entry{},
		keyDone: map[string]int64{},
		jobDone: map[string]int64{},
	}
	for _, m := range cfg.Models {
		g.models[m.Name] = newModelState(newLimits(m, cfg), now.UnixNano())
		g.models[m.Name].units = newUnitLimiter(m, cfg)
		g.models[m.Name].day = newDayQuota(m)
	}
	return g
}

// entry is the ledger's record of one Idempotency-Key. done is closed when
// the request that owns it finishes; resp is then the stored response, or
// nil if the owner did not complete (and the key was released).
type entry struct {
	done chan struct{}
	resp []byte
}

// claim returns key's entry and whether the caller now owns it (and must
// finish it with release or complete).
func (g *generation) claim(key string) (*entry, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e, ok := g.ledger[key]; ok {
		return e, false
	}
	e := &entry{done: make(chan struct{})}
	g.ledger[key] = e
	return e, true
}

// release gives up an owned key without a completion, so that the next
// request with it runs.
func (g *generation) release(key string, e *entry) {
	if e == nil {
		return
	}
	g.mu.Lock()
	if g.ledger[key] == e {
		delete(g.ledger, key)
	}
	g.mu.Unlock()
	close(e.done)
}

// complete records a completion, storing resp under key if the caller owns
// e, and counts it against key and jobID.
func (g *generation) complete(key, jobID string, e *entry, resp []byte) {
	g.completed.Add(1)
	if key == "" && jobID == "" {
		return
	}
	dup := false
	g.mu.Lock()
	if key != "" {
		dup = g.keyDone[key] > 0
		g.keyDone[key]++
	}
	if jobID != "" {
		dup = dup || g.jobDone[jobID] > 0
		g.jobDone[jobID]++
	}
	if e != nil {
		e.resp = resp
	}
	g.mu.Unlock()
	if e != nil {
		close(e.done)
	}
	if dup {
		g.duplicates.Add(1)
	}
}
