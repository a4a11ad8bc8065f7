package systest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestAnthropicCacheEstimateBothWays runs agent-like calls (a long system
// prompt marked for caching, a short turn of each call's own) through the
// official Anthropic SDK to an anthropic-kind provider whose tokenizer
// counts above Sluice's estimate, then one counting below it: once the
// prefix is warm, each call is reserved net of it, in the units admission
// reserves in, and must run. Before the guard checked a reservation in
// those units, a correction above 1 made every warm-prefix reservation
// fail verification and the jobs went round between admission and the
// executors without end.
func TestAnthropicCacheEstimateBothWays(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		factor float64 // the provider's count over characters/4
		above  bool    // the provider counts above Sluice's estimate
	}{
		{"provider counts above the estimate", 1.3, true},
		{"provider counts below the estimate", 0.6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			anthropicCacheRun(t, tc.factor, tc.above)
		})
	}
}

func anthropicCacheRun(t *testing.T, factor float64, above bool) {
	const model = "claude-agent"
	simSrv, simURL := StartSim(t, sim.Config{Profile: sim.ProfileAnthropic, Count: sim.TokenCount{Factor: factor},
		Models:  []sim.ModelLimits{{Name: model, RPM: 1000, ITPM: 60000, OTPM: 30000}},
		APIKeys: []string{"sim-secret"}})
	n := StartLogged(t, fmt.Sprintf(`
providers:
  - name: claude
    kind: anthropic
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: %s, rpm: 1000, itpm: 60000, otpm: 30000}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
`, simURL, model), Env)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := anthropic.NewClient(option.WithBaseURL(n.HTTP+"/"), option.WithAPIKey("acme-key"), option.WithMaxRetries(0),
		option.WithHeader("X-Sluice-Wait-Timeout", "90s"))
	// Ordinary English, about 3,000 tokens: characters/4 counts it a
	// little above Sluice's tokenizer; the factor sets the direction.
	system := strings.Repeat("You are a careful assistant who plans each step before acting on it. ", 170)
	call := func(turn int) (*anthropic.Message, error) {
		return c.Messages.New(ctx, anthropic.MessageNewParams{Model: model, MaxTokens: 50,
			System: []anthropic.TextBlockParam{{Text: system, CacheControl: anthropic.NewCacheControlEphemeralParam()}},
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(
				fmt.Sprintf("Step %d: %s", turn, strings.Repeat("read the file and report what changed. ", 20))))}})
	}
	// The first call writes the prefix and teaches the fleet the
	// provider's count.
	first, err := call(0)
	if err != nil {
		t.Fatalf("first call: %v", err)
	}
	if first.Usage.CacheCreationInputTokens == 0 {
		t.Fatalf("first call usage %+v: want the prefix written", first.Usage)
	}
	ratio := gaugeValue(n.Registry, "sluice_token_estimate_ratio")
	if ratio == 0 || (ratio > 1) != above {
		t.Fatalf("token correction %.3f: the provider was meant to count %s the estimate", ratio, map[bool]string{true: "above", false: "below"}[above])
	}
	const calls = 24
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := 1; i <= calls; i++ {
		wg.Go(func() {
			m, err := call(i)
			switch {
			case err != nil:
				errs <- fmt.Errorf("call %d: %w", i, err)
			case m.Usage.CacheReadInputTokens == 0:
				errs <- fmt.Errorf("call %d usage %+v: want the prefix read from the cache", i, m.Usage)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := simSrv.Messages()[model]
	if st.RateLimited != 0 || st.Admitted != calls+1 {
		t.Errorf("the provider admitted %d calls and refused %d for rate, want %d and 0", st.Admitted, st.RateLimited, calls+1)
	}
	if u := MetricSum(t, n.MetricsURL(), "sluice_requeues_total", `reason="unverified"`); u != 0 {
		t.Errorf("%v reservations did not verify, want none (correction %.3f)", u, ratio)
	}
	t.Logf("correction %.3f; provider: %d admitted, %d input tokens charged, %d read from the cache", ratio, st.Admitted, st.InputCharged, st.CacheRead)
}

// gaugeValue is the largest value of a gauge's series in a registry (0 if
// it has none).
func gaugeValue(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v = max(v, m.GetGauge().GetValue())
			}
		}
	}
	return v
}
