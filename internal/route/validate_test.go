package route_test

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/config"
)

// TestValidateRoutes covers config.ValidateRoutes; it lives here, next to
// the package that gives the routes their meaning.
func TestValidateRoutes(t *testing.T) {
	t.Parallel()
	known := func(p, m string) bool {
		for _, t := range []config.Target{mini, haiku, sonn, bulk, big} {
			if t.Provider == p && t.Model == m {
				return true
			}
		}
		return false
	}
	fb := func(t config.Target, when ...string) config.Fallback { return config.Fallback{Target: t, When: when} }
	good := func() config.Route {
		return config.Route{
			Task:      "summarize",
			Primary:   mini,
			Fallbacks: []config.Fallback{fb(haiku, config.CondProvider5xx), fb(sonn)},
			DegradeTo: &config.Fallback{Target: bulk, When: []string{config.CondBatchLowPriority}},
		}
	}
	with := func(f func(r *config.Route)) []config.Route {
		r := good()
		f(&r)
		return []config.Route{r}
	}
	for _, tc := range []struct {
		name   string
		routes []config.Route
		want   string // error prefix; "" for none
	}{
		{"valid", []config.Route{good(), {Primary: big}, {Task: "*", Primary: haiku}}, ""},
		{"none", nil, ""},
		{"unknown condition",
			with(func(r *config.Route) { r.Fallbacks[1].When = []string{config.CondProvider5xx, "x"} }),
			`routes[0].fallbacks[1].when[1]: unknown condition "x" (want one of provider_5xx, rate_limit_after_retry_budget, primary_unavailable, batch_low_priority)`},
		{"repeated condition",
			with(func(r *config.Route) { r.Fallbacks[0].When = []string{"provider_5xx", "provider_5xx"} }),
			`routes[0].fallbacks[0].when[1]: "provider_5xx" repeats routes[0].fallbacks[0].when[0]`},
		{"unknown condition in degrade_to",
			with(func(r *config.Route) { r.DegradeTo.When = []string{"cheap"} }),
			`routes[0].degrade_to.when[0]: unknown condition "cheap"`},
		{"unknown primary pair",
			with(func(r *config.Route) { r.Primary = config.Target{Provider: "anthropic", Model: "gpt-4o-mini"} }),
			`routes[0].primary: unknown provider/model pair "anthropic/gpt-4o-mini"`},
		{"unknown fallback pair",
			with(func(r *config.Route) { r.Fallbacks[1].Model = "claude-9" }),
			`routes[0].fallbacks[1]: unknown provider/model pair "anthropic/claude-9"`},
		{"unknown degrade_to pair",
			with(func(r *config.Route) { r.DegradeTo.Provider = "nobody" }),
			`routes[0].degrade_to: unknown provider/model pair "nobody/gpt-4o-mini-batch"`},
		{"primary provider missing",
			with(func(r *config.Route) { r.Primary.Provider = "" }),
			`routes[0].primary.provider: is required`},
		{"fallback model missing",
			with(func(r *config.Route) { r.Fallbacks[0].Model = "" }),
			`routes[0].fallbacks[0].model: is required`},
		{"fallback equal to the primary",
			with(func(r *config.Route) { r.Fallbacks[1].Target = mini }),
			`routes[0].fallbacks[1]: "openai/gpt-4o-mini" is the primary`},
		{"repeated fallback",
			with(func(r *config.Route) { r.Fallbacks[1].Target = haiku }),
			`routes[0].fallbacks[1]: "anthropic/claude-3-5-haiku" repeats routes[0].fallbacks[0]`},
		{"degrade_to equal to the primary",
			with(func(r *config.Route) { r.DegradeTo.Target = mini }),
			`routes[0].degrade_to: "openai/gpt-4o-mini" is the primary`},
		{"degrade_to requires when",
			with(func(r *config.Route) { r.DegradeTo.When = nil }),
			`routes[0].degrade_to.when: is required`},
		{"duplicate task",
			[]config.Route{{Primary: big}, good(), good()},
			`routes[2].task: duplicate task "summarize" (already routed by routes[1])`},
		{"bad task name",
			with(func(r *config.Route) { r.Task = "sum marize" }),
			`routes[0].task: "sum marize" must be`},
		{"two defaults for one model",
			[]config.Route{{Primary: big}, good(), {Task: "*", Primary: big}},
			`routes[2].primary: routes[0] is already the default route for model "gpt-4o"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := config.ValidateRoutes(tc.routes, known)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want no error", err)
			case tc.want != "" && err == nil:
				t.Errorf("got no error, want %q", tc.want)
			case tc.want != "" && !strings.HasPrefix(err.Error(), tc.want):
				t.Errorf("got %q, want it to start with %q", err, tc.want)
			}
		})
	}
}
