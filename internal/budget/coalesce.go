package budget

import "sync"

// coalesce makes one write of many per key: one goroutine writes a key at
// a time (the caller that found none writing), and what is added
// meanwhile joins its next write instead of being dropped or costing a
// compare-and-set of its own on the model's schedule, the key every
// admission process plans on (the Ledger's writes). When executors fell
// behind (TestChaos, after executors were killed), every lapsed job
// returned its instant, each return a write, the conflicts slowed planning
// and the sends, more instants lapsed, and no job reached the provider for
// minutes.
type coalesce[T any] struct {
	mu      sync.Mutex
	pending map[string]*pending[T]
}

type pending[T any] struct {
	items   []T
	writing bool
}

// maxCoalesced bounds what waits per key; past it the oldest are dropped
// (give-backs err towards the limit; a charge that many behind is as
// stale as the window it was for).
const maxCoalesced = 4096

// add queues item for key, and writes it (with what joins) unless a write
// of key is under way.
func (c *coalesce[T]) add(key string, item T, write func(string, []T)) {
	c.mu.Lock()
	if c.pending == nil {
		c.pending = map[string]*pending[T]{}
	}
	p := c.pending[key]
	if p == nil {
		p = &pending[T]{}
		c.pending[key] = p
	}
	p.items = append(p.items, item)
	if len(p.items) > maxCoalesced {
		p.items = p.items[len(p.items)-maxCoalesced:]
	}
	if p.writing {
		c.mu.Unlock()
		return
	}
	p.writing = true
	// A few rounds at most, so a busy key does not keep one job's
	// goroutine writing: what is left joins the next one's write.
	for round := 0; len(p.items) > 0 && round < 3; round++ {
		batch := p.items
		p.items = nil
		c.mu.Unlock()
		write(key, batch)
		c.mu.Lock()
	}
	p.writing = false
	c.mu.Unlock()
}
