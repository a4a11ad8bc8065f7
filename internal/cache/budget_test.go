package cache_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestHitsAndTenantBudget: a hit never spends provider budget; whether it
// spends its tenant's rpm and rpd is cache.hits_count_in_tenant_budget.
// Off, a tenant of rpm 3 gets six answers for one call; on, three (the
// call and two hits), then 429 tenant_budget with a Retry-After, over HTTP
// and for a job envelope alike. The spend not paid is counted at the
// model's price.
func TestHitsAndTenantBudget(t *testing.T) {
	t.Parallel()
	for _, counted := range []bool{false, true} {
		t.Run(fmt.Sprintf("counted=%v", counted), func(t *testing.T) {
			t.Parallel()
			l, simURL := startSim(t, sim.Config{})
			cfg, err := config.Parse([]byte(fmt.Sprintf(`
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: %s, rpm: 100000, tpm: 10000000, price: {input_per_mtok: 2, output_per_mtok: 8}}
tenants:
  - {name: acme, api_key_env: ACME_KEY, rpm: 3}
  - {name: globex, api_key_env: GLOBEX_KEY, rpd: 2}
cache: {hits_count_in_tenant_budget: %v}
`, simURL, model, counted)))
			if err != nil {
				t.Fatal(err)
			}
			info, _ := startNode(t, cfg, "", t.TempDir())
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for _, tc := range []struct {
				tenant, key string
				budget      int // its rpm or rpd
				asks        int
			}{{"acme", "acme-key", 3, 6}, {"globex", "globex-key", 2, 4}} {
				tag := "budget" + tc.tenant
				p := params(tag+": classify", 64)
				var usage openai.CompletionUsage
				ok, refused := 0, 0
				c := sdk(info, tc.key)
				for range tc.asks {
					var resp *http.Response
					r, err := c.Chat.Completions.New(ctx, p, cacheable, option.WithResponseInto(&resp))
					var apiErr *openai.Error
					switch {
					case err == nil:
						ok++
						usage = r.Usage
					case errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusTooManyRequests && apiErr.Code == "tenant_budget":
						refused++
						if apiErr.Response.Header.Get("Retry-After") == "" {
							t.Errorf("%s: a refused hit has no Retry-After", tc.tenant)
						}
					default:
						t.Fatalf("%s: %v", tc.tenant, err)
					}
				}
				if got := l.count(tag); got != 1 {
					t.Errorf("%s: %d provider calls, want 1", tc.tenant, got)
				}
				wantOK := tc.asks
				if counted {
					wantOK = tc.budget
				}
				if ok != wantOK || ok+refused != tc.asks {
					t.Errorf("%s (budget %d): %d answered, %d refused; want %d answered", tc.tenant, tc.budget, ok, refused, wantOK)
				}
				if counted && tc.tenant == "acme" {
					// A job envelope's hit is refused the same way.
					body := fmt.Sprintf(`{"cache":{"ttl":300},"request":{"model":%q,"temperature":0,"max_tokens":64,"messages":[{"role":"user","content":"%s: classify"}]}}`, model, tag)
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+info.HTTPAddr+"/v1/jobs", strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer acme-key")
					req.Header.Set("Content-Type", "application/json")
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
						t.Errorf("envelope hit past the budget: %d, Retry-After %q; want 429 with one", resp.StatusCode, resp.Header.Get("Retry-After"))
					}
				}
				hits := float64(ok - 1)
				want := hits * (float64(usage.PromptTokens)*2 + float64(usage.CompletionTokens)*8) / 1e6
				got := metric(t, info.Registry, "sluice_cache_saved_usd_total", map[string]string{"tenant": tc.tenant, "model": model})
				if want == 0 || math.Abs(got-want) > 1e-12 {
					t.Errorf("%s: sluice_cache_saved_usd_total %v, want %v (%v hits of %d+%d tokens at 2 and 8 per million)", tc.tenant, got, want, hits, usage.PromptTokens, usage.CompletionTokens)
				}
				tokens := metric(t, info.Registry, "sluice_cache_tokens_saved_total", map[string]string{"tenant": tc.tenant, "kind": "completion"})
				if tokens != hits*float64(usage.CompletionTokens) {
					t.Errorf("%s: sluice_cache_tokens_saved_total{kind=completion} %v, want %v", tc.tenant, tokens, hits*float64(usage.CompletionTokens))
				}
			}
		})
	}
}
