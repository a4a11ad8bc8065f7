package adapt

import (
	"sync"
	"time"
)

// Cache is a process's per-model view of what it derives from the fleet's
// learned records (the record itself, its last cut, the limits in effect),
// as last read, read again once older than its lifetime. Each reader
// picks the lifetime its decisions tolerate. Reads run outside the lock:
// two callers that find an entry stale may both read.
type Cache[V any] struct {
	lifetime time.Duration

	mu   sync.Mutex
	read map[string]cached[V]
}

type cached[V any] struct {
	v  V
	at time.Time
}

// NewCache returns an empty cache whose entries live for lifetime.
func NewCache[V any](lifetime time.Duration) *Cache[V] {
	return &Cache[V]{lifetime: lifetime, read: map[string]cached[V]{}}
}

// Get returns key's value as read at now or less than a lifetime before.
// Otherwise it calls load with the value last read (had: there is one)
// and keeps what load returns, read at now. When load fails nothing is
// kept, and Get returns the value last read (the zero V if none) with the
// error; the next Get loads again.
func (c *Cache[V]) Get(key string, now time.Time, load func(last V, had bool) (V, error)) (V, error) {
	c.mu.Lock()
	e, had := c.read[key]
	c.mu.Unlock()
	if had && now.Sub(e.at) < c.lifetime {
		return e.v, nil
	}
	v, err := load(e.v, had)
	if err != nil {
		return e.v, err
	}
	c.mu.Lock()
	c.read[key] = cached[V]{v: v, at: now}
	c.mu.Unlock()
	return v, nil
}

// Last returns key's value as last read, however old, without reading.
func (c *Cache[V]) Last(key string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.read[key]
	return e.v, ok
}
