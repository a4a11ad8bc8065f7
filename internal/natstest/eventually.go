package natstest

import (
	"testing"
	"time"
)

// Eventually calls cond every 20 ms until it returns nil, and fails the
// test with cond's last error when within passes first: the one way tests
// wait for an end state that arrives asynchronously.
func Eventually(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
