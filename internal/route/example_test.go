package route_test

import (
	"fmt"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/route"
)

func ExampleRouter_Next() {
	primary := config.Target{Provider: "openai", Model: "gpt-4o-mini"}
	rt := route.New([]config.Route{{
		Task:    "summarize",
		Primary: primary,
		Fallbacks: []config.Fallback{{
			Target: config.Target{Provider: "anthropic", Model: "claude-3-5-haiku"},
			When:   []string{config.CondProvider5xx, config.CondPrimaryUnavailable},
		}},
		DegradeTo: &config.Fallback{
			Target: config.Target{Provider: "openai", Model: "gpt-4o-mini-batch"},
			When:   []string{config.CondBatchLowPriority},
		},
	}})
	r, _ := rt.RouteFor("summarize", "gpt-4o-mini")

	// The retry policy gave up after repeated 503s.
	d, ok := rt.Next(r, route.Situation{Current: primary, Priority: "standard", LastClass: provider.Overloaded, RetryBudgetExhausted: true, Tried: []config.Target{primary}})
	fmt.Println(ok, d.Target, d.Reason, d.Degrade)

	// A batch job met a 429.
	d, ok = rt.Next(r, route.Situation{Current: primary, Priority: "batch", LastClass: provider.Retry, Tried: []config.Target{primary}})
	fmt.Println(ok, d.Target, d.Reason, d.Degrade)

	// A header timeout: the provider may have done the work. Stay.
	_, ok = rt.Next(r, route.Situation{Current: primary, Priority: "standard", LastClass: provider.Unknown, OutcomeUnknown: true, RetryBudgetExhausted: true})
	fmt.Println(ok)
	// Output:
	// true anthropic/claude-3-5-haiku provider_5xx false
	// true openai/gpt-4o-mini-batch batch_low_priority true
	// false
}
