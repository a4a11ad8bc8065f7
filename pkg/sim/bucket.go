package sim

import (
	"math"
	"time"
)

// bucket is one dimension's token bucket (ProfileTokenBucket): refilled at
// limit/60 per second, holding at most capacity. Amounts are kept in units
// of 1/60,000 of a request or token, so that one millisecond's refill is
// exactly limit units and the arithmetic is exact integers. The bucket is
// refilled at whole milliseconds: between two of them it holds what it held
// at the earlier one. The server takes arrivals to the millisecond, so at
// every arrival this is exactly the continuous refill.
type bucket struct {
	rate  int64 // refill per millisecond: the per-minute limit
	cap   int64 // capacity: rate · capacity in milliseconds
	level int64 // what it holds at millisecond at
	at    int64 // unix milliseconds
}

// unitsPerToken is how many bucket units make one request or token.
const unitsPerToken = 60_000

// maxBucketUnits bounds a bucket's capacity, leaving headroom for sums.
const maxBucketUnits = math.MaxInt64 / 4

// bucketMillis is BucketSeconds rounded to whole milliseconds.
func bucketMillis(seconds float64) int64 {
	return int64(math.Round(seconds * 1000))
}

// newBucket returns a full bucket for limit (0 = unlimited: nil) holding ms
// milliseconds of refill, at unix nanoseconds start.
func newBucket(limit, ms, start int64) *bucket {
	if limit == 0 {
		return nil
	}
	return &bucket{rate: limit, cap: limit * ms, level: limit * ms, at: start / int64(time.Millisecond)}
}

// units converts an amount to bucket units, saturating.
func units(n int64) int64 {
	if n > math.MaxInt64/unitsPerToken {
		return math.MaxInt64
	}
	return n * unitsPerToken
}

// refill brings the bucket to unix nanoseconds now. A clock that steps back
// refills nothing.
func (b *bucket) refill(now int64) {
	ms := now / int64(time.Millisecond)
	if ms <= b.at {
		return
	}
	if dt := ms - b.at; dt >= b.cap/b.rate {
		b.level = b.cap
	} else {
		b.level = min(b.cap, b.level+b.rate*dt)
	}
	b.at = ms
}

// target is what the bucket must hold before an amount of u units is taken:
// u itself, or the whole capacity if u is larger.
func (b *bucket) target(u int64) int64 {
	return min(u, b.cap)
}

// fits reports whether u units may be taken now.
func (b *bucket) fits(u int64) bool {
	return b.level >= b.target(u)
}

// take removes u units, stopping at empty. Callers checked fits.
func (b *bucket) take(u int64) {
	b.level = max(b.level-u, 0)
}

// wait returns how long after unix nanoseconds now the bucket holds enough
// for u units, if nothing is taken meanwhile.
func (b *bucket) wait(u, now int64) time.Duration {
	short := b.target(u) - b.level
	if short <= 0 {
		return 0
	}
	ms := b.at + (short+b.rate-1)/b.rate
	return time.Duration(ms*int64(time.Millisecond) - now)
}
