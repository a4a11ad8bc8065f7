package natstest

import (
	"context"
	"testing"
	"time"
)

// Eventually calls cond every 20 ms until it returns nil, and fails the
// test with cond's last error when within passes first: the one way tests
// wait for an end state that arrives asynchronously.
func Eventually(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var err error
	if !Poll(ctx, func() bool { err = cond(); return err == nil }) {
		t.Fatalf("not within %v: %v", within, err)
	}
}

// Poll calls cond, 20 ms apart, until it returns true (Poll returns true)
// or ctx ends (false): Eventually for a caller that bounds the wait with
// its own context and reports a failure itself.
func Poll(ctx context.Context, cond func() bool) bool {
	return PollEvery(ctx, 20*time.Millisecond, cond)
}

// PollEvery is Poll with another gap between calls, for a cond that takes
// what something else is waiting for (a tenant's one waiter slot) and must
// leave it free most of the time.
func PollEvery(ctx context.Context, gap time.Duration, cond func() bool) bool {
	tm := time.NewTimer(gap)
	defer tm.Stop()
	for !cond() {
		tm.Reset(gap)
		select {
		case <-ctx.Done():
			return cond()
		case <-tm.C:
		}
	}
	return true
}

// Pace waits for the i-th of a series of instants interval apart from
// start, and reports false if ctx ends first: the one way tests and
// benchmarks offer load at a rate. There time is the logic (the offered
// rate is in wall time, as the simulated provider's windows are), not a
// stand-in for a signal.
func Pace(ctx context.Context, start time.Time, i int, interval time.Duration) bool {
	return At(ctx, start.Add(time.Duration(i)*interval))
}

// At waits until t, a moment of a scenario's schedule (a fault injected
// 20 s into a run), and reports false if ctx ends first.
func At(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}
