package executor

import (
	"context"
	"testing"
	"time"
)

// A paced call wakes as far ahead of its instant as this executor's
// wake-to-ready times call for: slotAhead until they are known, then the
// typical one on time and the slowest late by at most a third of the
// tolerance, never more than maxWakeAhead.
func TestWakeAheadLearnsReadiness(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tr := &transits{env: &env{now: func() time.Time { return now }}, wake: newWake(15 * time.Millisecond)}
	if got := tr.wakeAhead(now); got != slotAhead {
		t.Fatalf("wake ahead before any readiness: %v, want %v", got, slotAhead)
	}
	ready := func(took time.Duration, n int) {
		for range n {
			tr.noteWoke(withWoke(context.Background(), now.Add(-took)))
		}
	}
	ready(120*time.Millisecond, 15)
	if got := tr.wakeAhead(now); got != slotAhead {
		t.Fatalf("wake ahead on 15 readinesses: %v, want %v (not yet trusted)", got, slotAhead)
	}
	ready(120*time.Millisecond, 1)
	if got, want := tr.wakeAhead(now), 120*time.Millisecond+500*time.Microsecond; got != want { // the median, and 0.5 ms to spare
		t.Fatalf("wake ahead after readiness took 120ms: %v, want %v", got, want)
	}
	ready(5*time.Second, 128)
	if got := tr.wakeAhead(now); got != maxWakeAhead {
		t.Fatalf("wake ahead after readiness took 5s: %v, want the bound %v", got, maxWakeAhead)
	}
	ready(time.Millisecond, 128)
	if got := tr.wakeAhead(now); got != slotAhead {
		t.Fatalf("wake ahead after fast readiness: %v, want the floor %v", got, slotAhead)
	}
	// A call that was not put to sleep teaches nothing.
	tr.noteWoke(context.Background())
}
