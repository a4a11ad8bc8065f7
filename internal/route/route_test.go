package route_test

import (
	"bytes"
	"slices"
	"testing"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/route"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	mini  = config.Target{Provider: "openai", Model: "gpt-4o-mini"}
	haiku = config.Target{Provider: "anthropic", Model: "claude-3-5-haiku"}
	sonn  = config.Target{Provider: "anthropic", Model: "claude-sonnet-4"}
	bulk  = config.Target{Provider: "openai", Model: "gpt-4o-mini-batch"}
	big   = config.Target{Provider: "openai", Model: "gpt-4o"}
)

const routesYAML = `
routes:
  - task: summarize
    primary: {provider: openai, model: gpt-4o-mini}
    fallbacks:
      - {provider: anthropic, model: claude-3-5-haiku, when: [provider_5xx, rate_limit_after_retry_budget, primary_unavailable]}
      - {provider: anthropic, model: claude-sonnet-4, when: [primary_unavailable, provider_5xx]}
    degrade_to: {provider: openai, model: gpt-4o-mini-batch, when: [batch_low_priority]}
  - primary: {provider: openai, model: gpt-4o}
    fallbacks:
      - {provider: anthropic, model: claude-sonnet-4}
`

// setup decodes routesYAML the way config.Parse decodes the file (unknown
// keys are errors) and returns its routes.
func setup(t *testing.T) []config.Route {
	t.Helper()
	var doc struct {
		Routes []config.Route `yaml:"routes"`
	}
	dec := yaml.NewDecoder(bytes.NewReader([]byte(routesYAML)))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("decode routes: %v", err)
	}
	if err := config.ValidateRoutes(doc.Routes, nil); err != nil {
		t.Fatalf("ValidateRoutes: %v", err)
	}
	return doc.Routes
}

func TestDecode(t *testing.T) {
	t.Parallel()
	rs := setup(t)
	if got, want := len(rs), 2; got != want {
		t.Fatalf("routes: got %d, want %d", got, want)
	}
	r := rs[0]
	for _, tc := range []struct {
		what      string
		got, want any
	}{
		{"routes[0].task", r.Task, "summarize"},
		{"routes[0].primary", r.Primary, mini},
		{"routes[0].fallbacks[0]", r.Fallbacks[0].Target, haiku},
		{"routes[0].fallbacks[0].when[1]", r.Fallbacks[0].When[1], config.CondRateLimitAfterRetryBudget},
		{"routes[0].degrade_to", r.DegradeTo.Target, bulk},
		{"routes[0].degrade_to.when", len(r.DegradeTo.When), 1},
		{"routes[1] default", rs[1].IsDefault(), true},
		{"routes[1].fallbacks[0].when", len(rs[1].Fallbacks[0].When), 0},
		{"Target.String", mini.String(), "openai/gpt-4o-mini"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.what, tc.got, tc.want)
		}
	}
}

func TestRouteFor(t *testing.T) {
	t.Parallel()
	rt := route.New(append(setup(t), config.Route{Task: "*", Primary: haiku}))
	for _, tc := range []struct {
		name, task, model string
		want              config.Target // primary of the route; zero for none
	}{
		{"task wins", "summarize", "gpt-4o-mini", mini},
		{"task wins whatever the model", "summarize", "gpt-4o", mini},
		{"unknown task: default for the model", "translate", "gpt-4o", big},
		{"no task: default for the model", "", "gpt-4o", big},
		{"star default", "", "claude-3-5-haiku", haiku},
		{"task route is not a model default", "", "gpt-4o-mini", config.Target{}},
		{"no route", "", "claude-sonnet-4", config.Target{}},
		{"task star is no task", "*", "gpt-4o", big},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, ok := rt.RouteFor(tc.task, tc.model)
			if ok != (tc.want != config.Target{}) {
				t.Fatalf("RouteFor(%q, %q): got ok=%v, want %v", tc.task, tc.model, ok, !ok)
			}
			if ok && r.Primary != tc.want {
				t.Errorf("RouteFor(%q, %q): got primary %v, want %v", tc.task, tc.model, r.Primary, tc.want)
			}
		})
	}
}

// in returns a predicate true for the given targets.
func in(ts ...config.Target) func(config.Target) bool {
	return func(t config.Target) bool { return slices.Contains(ts, t) }
}

func TestNext(t *testing.T) {
	t.Parallel()
	rs := setup(t)
	withDegrade := func(when ...string) config.Route {
		r := config.Route{Primary: mini, Fallbacks: []config.Fallback{{Target: haiku, When: []string{config.CondPrimaryUnavailable}}}}
		r.DegradeTo = &config.Fallback{Target: bulk, When: when}
		return r
	}
	none := route.Decision{}
	for _, tc := range []struct {
		name  string
		route *config.Route // nil: routes[0] (summarize)
		s     route.Situation
		want  route.Decision // zero: no fallback
	}{
		// One per condition.
		{"provider_5xx", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.Overloaded, RetryBudgetExhausted: true},
			route.Decision{Target: haiku, Reason: "provider_5xx"}},
		{"provider_5xx: connect failures", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.ConnectFailed, RetryBudgetExhausted: true},
			route.Decision{Target: haiku, Reason: "provider_5xx"}},
		{"rate_limit_after_retry_budget", nil,
			route.Situation{Current: mini, Priority: "interactive", LastClass: provider.Retry, RetryBudgetExhausted: true},
			route.Decision{Target: haiku, Reason: "rate_limit_after_retry_budget"}},
		{"primary_unavailable: breaker open before any attempt", nil,
			route.Situation{Current: mini, Priority: "standard", BreakerOpen: in(mini)},
			route.Decision{Target: haiku, Reason: "primary_unavailable"}},
		{"primary_unavailable: credential broken", nil,
			route.Situation{Current: mini, Priority: "standard", CredentialBroken: in(mini)},
			route.Decision{Target: haiku, Reason: "primary_unavailable"}},
		{"primary_unavailable: 401/403", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.AuthBroken},
			route.Decision{Target: haiku, Reason: "primary_unavailable"}},
		{"primary_unavailable: quota or billing", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.OperatorAction},
			route.Decision{Target: haiku, Reason: "primary_unavailable"}},
		{"batch_low_priority: a 429", nil,
			route.Situation{Current: mini, Priority: "batch", LastClass: provider.Retry},
			route.Decision{Target: bulk, Reason: "batch_low_priority", Degrade: true}},
		{"batch_low_priority: breaker open", nil,
			route.Situation{Current: mini, Priority: "batch", BreakerOpen: in(mini)},
			route.Decision{Target: bulk, Reason: "batch_low_priority", Degrade: true}},

		// Not yet, or never.
		{"a 5xx within the retry budget stays", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.Overloaded},
			none},
		{"a 429 within the retry budget stays", nil,
			route.Situation{Current: mini, Priority: "interactive", LastClass: provider.Retry},
			none},
		{"400 never falls back", nil,
			route.Situation{Current: mini, Priority: "batch", LastClass: provider.Fail, RetryBudgetExhausted: true, BreakerOpen: in(mini), CredentialBroken: in(mini)},
			none},
		{"unknown outcome never falls back", nil,
			route.Situation{Current: mini, Priority: "batch", LastClass: provider.Overloaded, RetryBudgetExhausted: true, OutcomeUnknown: true, BreakerOpen: in(mini)},
			none},
		{"unknown class with unknown outcome", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.Unknown, OutcomeUnknown: true, CredentialBroken: in(mini)},
			none},
		{"success stays", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.Success, BreakerOpen: in(mini)},
			none},
		{"nothing happened", nil,
			route.Situation{Current: mini, Priority: "standard"},
			none},

		// Order and skipping.
		{"first fallback tried: next one", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.Overloaded, RetryBudgetExhausted: true, Tried: []config.Target{mini, haiku}},
			route.Decision{Target: sonn, Reason: "provider_5xx"}},
		{"first fallback's breaker open: next one", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.Overloaded, RetryBudgetExhausted: true, BreakerOpen: in(haiku)},
			route.Decision{Target: sonn, Reason: "provider_5xx"}},
		{"first fallback's credential broken: next one", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.AuthBroken, CredentialBroken: in(mini, haiku)},
			route.Decision{Target: sonn, Reason: "primary_unavailable"}},
		{"first fallback does not list the condition: next one", &config.Route{Primary: mini, Fallbacks: []config.Fallback{
			{Target: haiku, When: []string{config.CondPrimaryUnavailable}},
			{Target: sonn, When: []string{config.CondProvider5xx}},
		}},
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.Overloaded, RetryBudgetExhausted: true},
			route.Decision{Target: sonn, Reason: "provider_5xx"}},
		{"every fallback tried or open", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.Overloaded, RetryBudgetExhausted: true, Tried: []config.Target{haiku}, BreakerOpen: in(sonn)},
			none},
		{"failing on a fallback moves on, never back", nil,
			route.Situation{Current: haiku, Priority: "standard", LastClass: provider.Overloaded, RetryBudgetExhausted: true, Tried: []config.Target{mini, haiku}},
			route.Decision{Target: sonn, Reason: "provider_5xx"}},
		{"never to the current target, even untried", nil,
			route.Situation{Current: haiku, Priority: "standard", LastClass: provider.AuthBroken},
			route.Decision{Target: sonn, Reason: "primary_unavailable"}},
		{"reason: the first condition in canonical order", &config.Route{Primary: mini, Fallbacks: []config.Fallback{
			{Target: haiku, When: []string{config.CondPrimaryUnavailable, config.CondProvider5xx}},
		}},
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.Overloaded, RetryBudgetExhausted: true, BreakerOpen: in(mini)},
			route.Decision{Target: haiku, Reason: "provider_5xx"}},
		{"empty when: any failure", &rs[1],
			route.Situation{Current: big, Priority: "standard", LastClass: provider.Retry, RetryBudgetExhausted: true},
			route.Decision{Target: sonn, Reason: "rate_limit_after_retry_budget"}},
		{"empty when: not batch throttling", &rs[1],
			route.Situation{Current: big, Priority: "batch", LastClass: provider.Retry},
			none},

		// degrade_to.
		{"degrade_to only for batch: standard 429 stays", nil,
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.Retry},
			none},
		{"degrade_to only for batch: interactive with breaker open falls back", nil,
			route.Situation{Current: mini, Priority: "interactive", BreakerOpen: in(mini)},
			route.Decision{Target: haiku, Reason: "primary_unavailable"}},
		{"batch degrades before falling back", nil,
			route.Situation{Current: mini, Priority: "batch", LastClass: provider.Retry, RetryBudgetExhausted: true},
			route.Decision{Target: bulk, Reason: "batch_low_priority", Degrade: true}},
		{"batch falls back when degrade_to does not match", nil,
			route.Situation{Current: mini, Priority: "batch", LastClass: provider.Overloaded, RetryBudgetExhausted: true},
			route.Decision{Target: haiku, Reason: "provider_5xx"}},
		{"degrade_to breaker open: batch waits", nil,
			route.Situation{Current: mini, Priority: "batch", LastClass: provider.Retry, BreakerOpen: in(bulk)},
			none},
		{"degrade_to already tried", nil,
			route.Situation{Current: mini, Priority: "batch", LastClass: provider.Retry, Tried: []config.Target{mini, bulk}},
			none},
		{"degrade_to with other conditions: after the fallbacks", ptr(withDegrade(config.CondProvider5xx)),
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.Overloaded, RetryBudgetExhausted: true},
			route.Decision{Target: bulk, Reason: "provider_5xx", Degrade: true}},
		{"fallbacks before degrade_to for non-batch", ptr(withDegrade(config.CondPrimaryUnavailable)),
			route.Situation{Current: mini, Priority: "standard", LastClass: provider.AuthBroken},
			route.Decision{Target: haiku, Reason: "primary_unavailable"}},
		{"degrade_to without when never matches", ptr(withDegrade()),
			route.Situation{Current: mini, Priority: "batch", LastClass: provider.Retry, RetryBudgetExhausted: true},
			none},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := tc.route
			if r == nil {
				r = &rs[0]
			}
			got, ok := route.New(nil).Next(r, tc.s)
			if ok != (tc.want != none) || got != tc.want {
				t.Errorf("Next: got %+v, %v; want %+v, %v", got, ok, tc.want, tc.want != none)
			}
		})
	}
}

func TestNextNilRoute(t *testing.T) {
	t.Parallel()
	if d, ok := route.New(nil).Next(nil, route.Situation{Current: mini, LastClass: provider.AuthBroken}); ok {
		t.Errorf("Next(nil route): got %+v, want no fallback", d)
	}
}

func TestNewCopiesRoutes(t *testing.T) {
	t.Parallel()
	rs := setup(t)
	rt := route.New(rs)
	rs[0].Fallbacks[0].Target = big
	rs[0].DegradeTo.When[0] = config.CondProvider5xx
	r, _ := rt.RouteFor("summarize", "")
	if r.Fallbacks[0].Target != haiku || r.DegradeTo.When[0] != config.CondBatchLowPriority {
		t.Errorf("Router shares the caller's routes: got %v / %v", r.Fallbacks[0].Target, r.DegradeTo.When)
	}
}

func ptr[T any](v T) *T { return &v }
