package config_test

import (
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
)

// The example: one name under three providers is one group,
// ordered by tier, then weight, then file order.
func TestGroupOfDeployments(t *testing.T) {
	t.Parallel()
	c, err := config.Parse([]byte(`
providers:
  - {name: east, kind: openai, base_url: http://127.0.0.1:9002/v1,
     models: [{name: gpt-4o-mini, tier: 1, rpm: 120, tpm: 1000000}]}
  - {name: west, kind: openai, base_url: http://127.0.0.1:9003/v1,
     models: [{name: gpt-4o-mini, tier: 1, weight: 3, rpm: 60, tpm: 1000000, upstream: gpt-4o-mini-2024-07-18}]}
  - {name: ptu,  kind: openai, base_url: http://127.0.0.1:9001/v1,
     models: [{name: gpt-4o-mini, rpm: 120, tpm: 1000000}, {name: other}]}
routes:
  - {primary: {provider: ptu, model: other}, fallbacks: [{provider: west, model: gpt-4o-mini}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	g := c.Group("gpt-4o-mini")
	var got []string
	for _, d := range g {
		got = append(got, d.Provider.Name)
	}
	if want := []string{"ptu", "west", "east"}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("group order = %v, want %v (tier, then weight)", got, want)
	}
	if w := g[0].Model.Weight; w != 1 {
		t.Errorf("default weight = %d, want 1", w)
	}
	if u := g[1].Model.UpstreamName(); u != "gpt-4o-mini-2024-07-18" {
		t.Errorf("west's upstream = %q", u)
	}
	if u := g[0].Model.UpstreamName(); u != "gpt-4o-mini" {
		t.Errorf("ptu's upstream = %q, want the name callers use", u)
	}
	if _, m, ok := c.Deployment("east", "gpt-4o-mini"); !ok || m.RPM != 120 || m.Tier != 1 {
		t.Errorf("Deployment(east) = %+v, %v", m, ok)
	}
	if _, _, ok := c.Deployment("east", "other"); ok {
		t.Error("Deployment(east, other) found; east does not serve it")
	}
	if len(c.Group("nope")) != 0 {
		t.Error("Group(nope) not empty")
	}
	a := c.Admission.CacheAffinity
	if a.TTL.D() != 5*time.Minute || a.MaxDelay.D() != config.DefaultAffinityMaxDelay {
		t.Errorf("cache_affinity defaults = %s, %s", a.TTL.D(), a.MaxDelay.D())
	}
}
