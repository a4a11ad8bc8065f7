package calib

import (
	"context"
	"testing"
)

func TestFactorScalesOnlyLowEstimates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name              string
		estimated, actual int
		want              float64
	}{
		{"exact", 100, 100, 1},
		{"estimates run high", 100, 80, 1},
		{"estimates run low", 100, 120, 1.2},
		{"absurd ratio is capped", 100, 1000, MaxRatio},
	} {
		tb := New(nil, nil)
		for range 200 {
			tb.Observe(ctx, "k", tc.estimated, tc.actual)
		}
		if got := tb.Factor(ctx, "k"); got < tc.want-0.01 || got > tc.want+0.01 {
			t.Errorf("%s: factor %.3f, want %.3f", tc.name, got, tc.want)
		}
	}
	tb := New(nil, nil)
	for range 5 {
		tb.Observe(ctx, "k", 100, 200)
	}
	if got := tb.Factor(ctx, "k"); got != 1 {
		t.Errorf("after 5 samples the factor is %.2f; want 1 until there are enough samples", got)
	}
	if got := tb.Factor(ctx, "unknown"); got != 1 {
		t.Errorf("an unseen model's factor is %.2f, want 1", got)
	}
}
