package budget

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/natstest"
)

// TestWritesCoalesce: give-backs (or charges) that arrive while one is
// being written are written together next, none dropped, and one write at
// a time per key.
func TestWritesCoalesce(t *testing.T) {
	t.Parallel()
	var r coalesce[Return]
	var mu sync.Mutex
	var got, writes, writing, most int
	release := make(chan struct{})
	first := make(chan struct{})
	write := func(_ string, rs []Return) {
		mu.Lock()
		writing++
		most = max(most, writing)
		writes++
		n := writes
		mu.Unlock()
		if n == 1 {
			close(first)
			<-release // the first write is slow: others arrive meanwhile
		}
		mu.Lock()
		for _, x := range rs {
			got += x.Cost.Output
		}
		writing--
		mu.Unlock()
	}
	var wg sync.WaitGroup
	wg.Go(func() { r.add("k", Return{At: time.Now(), Cost: Cost{Output: 1}}, write) })
	<-first
	for range 50 {
		wg.Go(func() { r.add("k", Return{At: time.Now(), Cost: Cost{Output: 1}}, write) })
	}
	// The 50 were queued behind the write under way (each returns at once).
	natstest.Eventually(t, 10*time.Second, func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if n := len(r.pending["k"].items); n != 50 {
			return fmt.Errorf("%d give-backs queued, want 50", n)
		}
		return nil
	})
	close(release)
	wg.Wait()
	if got != 51 || writes != 2 || most != 1 {
		t.Fatalf("returned %d in %d writes (at most %d at once), want 51 in 2, one at a time", got, writes, most)
	}
}
