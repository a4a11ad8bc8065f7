package budget_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/fakeclock"
)

func ExampleStore_Take() {
	// In Sluice the KV is the budgets bucket (a jetstream.KeyValue).
	clock := fakeclock.New(time.Unix(1_750_000_000, 0))
	st := budget.NewStore(newFakeKV(), budget.Params{Slice: 250 * time.Millisecond, DispatchGrace: time.Second, BurstFraction: 1}, clock.Now)
	lim := budget.Limits{RPM: 2, TPM: 10_000}
	jobs := []budget.Cost{{Requests: 1, Tokens: 1200}, {Requests: 1, Tokens: 800}, {Requests: 1, Tokens: 500}}

	g, err := st.Take(context.Background(), budget.ModelKey("openai", "gpt-4o-mini"), lim, jobs)
	if err != nil {
		fmt.Println(err) // fail closed: dispatch nothing
		return
	}
	fmt.Printf("granted %d, refused for %s, retry in %v, start calls by +%v\n",
		g.N, g.Reason, g.RetryAt.Sub(clock.Now()), g.ValidUntil.Sub(clock.Now()))
	// Output: granted 2, refused for rpm, retry in 1m1.25s, start calls by +1.25s
}
