package executor

import (
	"context"
	"sync/atomic"
	"time"
)

// # Waiting for a send instant
//
// Go's timers wake through the network poller, whose wait Linux counts in
// whole milliseconds (epoll): a call that waits for its send instant on a
// timer leaves up to a millisecond after it, half a millisecond on
// average, on the way of every paced call. So the wait ends with the
// thread itself asleep (nanosleep) for the last millisecond, which wakes
// within tens of microseconds. A call never leaves before its instant
// either way. At most fineWaiters calls of the process wait so at once
// (each holds a thread); the others wait on the timer to the end.

// fineWindow is the end of a wait the thread sleeps through.
const fineWindow = time.Millisecond

// fineWaiters bounds the threads asleep for an instant at once.
const fineWaiters = 4

var fineWaiting atomic.Int32

// waitInstant waits until t or ctx ends; it reports whether ctx is live.
func waitInstant(ctx context.Context, t time.Time) bool {
	if time.Until(t) > fineWindow && !sleepUntil(ctx, t.Add(-fineWindow)) {
		return false
	}
	if fineWaiting.Add(1) > fineWaiters {
		fineWaiting.Add(-1)
		return sleepUntil(ctx, t)
	}
	defer fineWaiting.Add(-1)
	for d := time.Until(t); d > 0; d = time.Until(t) {
		sleepThread(d)
	}
	return ctx.Err() == nil
}
