package adapt

import (
	"errors"
	"testing"
	"time"
)

func TestCacheLifetime(t *testing.T) {
	t.Parallel()
	c := NewCache[int](time.Second)
	t0 := time.Unix(1000, 0)
	loads := 0
	load := func(v int) func(int, bool) (int, error) {
		return func(int, bool) (int, error) { loads++; return v, nil }
	}
	for _, step := range []struct {
		at        time.Duration
		load      int
		want      int
		wantLoads int
	}{
		{0, 1, 1, 1},                      // empty: loads
		{999 * time.Millisecond, 2, 1, 1}, // younger than the lifetime: cached
		{time.Second, 3, 3, 2},            // a lifetime old: loads again
		{1500 * time.Millisecond, 4, 3, 2},
	} {
		got, err := c.Get("k", t0.Add(step.at), load(step.load))
		if err != nil || got != step.want || loads != step.wantLoads {
			t.Fatalf("at %s: got %d, %v after %d loads; want %d after %d", step.at, got, err, loads, step.want, step.wantLoads)
		}
	}
	if v, ok := c.Last("k"); !ok || v != 3 {
		t.Fatalf("Last: got %d, %v; want 3, true", v, ok)
	}
	if _, ok := c.Last("other"); ok {
		t.Fatal("Last of an unread key: got ok")
	}
}

func TestCacheFailedLoadKeepsNothing(t *testing.T) {
	t.Parallel()
	c := NewCache[int](time.Second)
	t0 := time.Unix(1000, 0)
	boom := errors.New("boom")
	fail := func(int, bool) (int, error) { return 9, boom }
	if got, err := c.Get("k", t0, fail); !errors.Is(err, boom) || got != 0 {
		t.Fatalf("first load fails: got %d, %v; want 0, boom", got, err)
	}
	var sawLast, sawHad = -1, true
	ok := func(last int, had bool) (int, error) { sawLast, sawHad = last, had; return 5, nil }
	if got, err := c.Get("k", t0, ok); err != nil || got != 5 || sawHad || sawLast != 0 {
		t.Fatalf("after a failure: got %d, %v (load saw %d, %v); want a fresh load of 5 that had nothing", got, err, sawLast, sawHad)
	}
	if got, err := c.Get("k", t0.Add(2*time.Second), fail); !errors.Is(err, boom) || got != 5 {
		t.Fatalf("stale, load fails: got %d, %v; want the last value 5 and boom", got, err)
	}
	if got, err := c.Get("k", t0.Add(2*time.Second), ok); err != nil || got != 5 || !sawHad || sawLast != 5 {
		t.Fatalf("stale after a failure: got %d, %v (load saw %d, %v); want a load that had 5", got, err, sawLast, sawHad)
	}
}
