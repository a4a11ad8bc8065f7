package bench

import (
	"context"
	"math"
	"sync"
	"time"
)

// Bucket is a token bucket refilled at a per-minute limit's rate (limit/60
// per second) up to a capacity of one second's refill (at least 1). It is a
// debt bucket: a take larger than what is left drives the level negative, and
// the next take waits until the debt is repaid. That makes grants FIFO in the
// order they were asked for, and lets a request larger than the capacity
// through once the bucket is full.
//
// A Bucket is not safe for concurrent use; Limiter guards its buckets.
type Bucket struct {
	rate     float64 // per second
	capacity float64
	level    float64 // as of last
	last     time.Time
}

// NewBucket returns a full bucket for a per-minute limit.
func NewBucket(perMinute int, now time.Time) *Bucket {
	rate := float64(perMinute) / 60
	c := max(rate, 1)
	return &Bucket{rate: rate, capacity: c, level: c, last: now}
}

// Capacity is the most the bucket holds.
func (b *Bucket) Capacity() float64 { return b.capacity }

// Level returns what the bucket holds at now (negative while in debt).
func (b *Bucket) Level(now time.Time) float64 {
	b.advance(now)
	return b.level
}

func (b *Bucket) advance(now time.Time) {
	if dt := now.Sub(b.last); dt > 0 {
		b.level = math.Min(b.capacity, b.level+b.rate*dt.Seconds())
		b.last = now
	}
}

// wait returns how long from now until a take of n may be granted: until the
// level reaches n, or the capacity if n is larger.
func (b *Bucket) wait(now time.Time, n float64) time.Duration {
	b.advance(now)
	need := math.Min(n, b.capacity) - b.level
	if need <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(need / b.rate * float64(time.Second)))
}

// take grants n at now+d: the level at that instant (refill capped at the
// capacity) minus n, expressed as the level at now.
func (b *Bucket) take(now time.Time, d time.Duration, n float64) {
	b.advance(now)
	refill := b.rate * d.Seconds()
	atGrant := math.Min(b.capacity, b.level+refill) - n
	b.level = atGrant - refill
}

// give returns n to the bucket (never above its capacity).
func (b *Bucket) give(now time.Time, n float64) {
	b.advance(now)
	b.level = math.Min(b.capacity, b.level+n)
}

// Limiter paces calls through an optional request bucket and an optional
// token bucket, granting both together in FIFO order. It is safe for
// concurrent use.
type Limiter struct {
	mu       sync.Mutex
	now      func() time.Time
	requests *Bucket // nil: requests are not limited
	tokens   *Bucket // nil: tokens are not limited
}

// NewLimiter makes a limiter for the given per-minute limits; 0 leaves a
// dimension unlimited.
func NewLimiter(rpm, tpm int) *Limiter {
	l := &Limiter{now: time.Now}
	now := l.now()
	if rpm > 0 {
		l.requests = NewBucket(rpm, now)
	}
	if tpm > 0 {
		l.tokens = NewBucket(tpm, now)
	}
	return l
}

// Reserve takes one request and n tokens and returns how long the caller must
// wait before sending.
func (l *Limiter) Reserve(n int) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	var d time.Duration
	if l.requests != nil {
		d = max(d, l.requests.wait(now, 1))
	}
	if l.tokens != nil {
		d = max(d, l.tokens.wait(now, float64(n)))
	}
	if l.requests != nil {
		l.requests.take(now, d, 1)
	}
	if l.tokens != nil {
		l.tokens.take(now, d, float64(n))
	}
	return d
}

// Wait reserves one request and n tokens and sleeps until they are granted.
// If ctx ends first, the reservation is handed back and ctx's error returned.
func (l *Limiter) Wait(ctx context.Context, n int) error {
	d := l.Reserve(n)
	if sleep(ctx, d) {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.requests != nil {
		l.requests.give(now, 1)
	}
	if l.tokens != nil {
		l.tokens.give(now, float64(n))
	}
	return ctx.Err()
}

// Refund returns n tokens to the token bucket (a shorter completion than
// reserved, or a rejected call the provider did not charge).
func (l *Limiter) Refund(n int) {
	if n <= 0 || l.tokens == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tokens.give(l.now(), float64(n))
}

// sleep waits d or until ctx ends, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
