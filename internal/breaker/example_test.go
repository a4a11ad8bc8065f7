package breaker_test

import (
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/breaker"
)

func ExampleBreaker() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := breaker.New(breaker.Config{MinRequests: 2, Probes: 1, Now: func() time.Time { return now }})

	for range 2 { // two 503s in a row
		if ok, probe, _ := b.Allow(); ok {
			b.Record(false, probe)
		}
	}
	ok, _, retryAt := b.Allow()
	fmt.Println(b.State(), ok, retryAt.Sub(now))

	now = retryAt
	ok, probe, _ := b.Allow()
	fmt.Println(b.State(), ok, probe)
	b.Record(true, probe) // the probe succeeded
	fmt.Println(b.State())
	// Output:
	// open false 15s
	// half_open true true
	// closed
}
