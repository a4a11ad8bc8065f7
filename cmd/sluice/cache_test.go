package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/cache"
)

func TestCacheStatsLine(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		st   cache.Stats
		want []string
	}{
		{cache.Stats{Entries: 3, Bytes: 512 << 10, MaxBytes: 1 << 20, Evicts: true, Oldest: now.Add(-90 * time.Second)},
			[]string{"entries 3, 524288 bytes of 1048576 (50%", "the oldest entries give way", "oldest stored 1m30s ago"}},
		{cache.Stats{MaxBytes: 1 << 20}, []string{"entries 0, 0 bytes of 1048576 (0%", "new answers are not stored"}},
	} {
		got := statsLine(&tc.st, now)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("statsLine(%+v) = %q, want it to contain %q", tc.st, got, w)
			}
		}
	}
}
