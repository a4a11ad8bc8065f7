package admission

import (
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
)

func TestDemandBlocks(t *testing.T) {
	t.Parallel()
	slice := 250 * time.Millisecond // 25 blocks 10 ms apart
	for _, tc := range []struct {
		name string
		d    budget.Cost
		n    int // blocks
		per  budget.Cost
	}{
		{"no demand", budget.Cost{}, 0, budget.Cost{}},
		{"sparse: each job places itself", budget.Cost{Requests: 24, Tokens: 2400}, 0, budget.Cost{}},
		{"dense enough: blocks 10 ms apart", budget.Cost{Requests: 25, Tokens: 2500}, 25, budget.Cost{Requests: 1, Tokens: 100}},
		{"denser: more per block, no more blocks", budget.Cost{Requests: 100, Tokens: 5000}, 25, budget.Cost{Requests: 4, Tokens: 200}},
		{"no tokens: none", budget.Cost{Requests: 100}, 0, budget.Cost{}},
	} {
		got := demandBlocks(tc.d, slice)
		if len(got) != tc.n {
			t.Errorf("%s: got %d blocks, want %d", tc.name, len(got), tc.n)
			continue
		}
		for _, b := range got {
			if b != tc.per {
				t.Errorf("%s: got a block of %+v, want %+v", tc.name, b, tc.per)
				break
			}
		}
	}
}
