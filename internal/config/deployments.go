package config

import (
	"fmt"
	"slices"
	"time"
	"unicode"

	"github.com/sluice-dev/sluice/pkg/clip"
)

// # Deployments
//
// The same model name listed under several providers forms a group: each
// (provider, model) is a deployment with everything a model has on its own
// (schedule, learned limits, concurrency, breaker, day quotas,
// calibration). Admission places each job of the group on one deployment:
// the lowest tier first (tier), then the one that can send it soonest,
// weight breaking ties. What callers see of a model is the group's:
// deployments of one name must agree on the provider kind's family
// (anthropic or not), units and allowed or denied fields.

// MaxTier bounds a model's tier.
const MaxTier = 9

// MaxDeploymentWeight bounds a model's weight.
const MaxDeploymentWeight = 1000

// DefaultAffinityTTL is cache_affinity.ttl when absent: about as long as
// providers keep a prompt prefix cached.
const DefaultAffinityTTL = 5 * time.Minute

// DefaultAffinityMaxDelay is cache_affinity.max_delay when absent.
const DefaultAffinityMaxDelay = 2 * time.Second

// CacheAffinity keeps jobs that share an affinity key (a conversation)
// on the deployment that served the key last, so the provider's prompt
// cache serves them.
type CacheAffinity struct {
	// TTL is how long a key stays on its deployment after its last job
	// (the provider's cache lifetime).
	TTL Duration `yaml:"ttl"`
	// MaxDelay: a job leaves its key's deployment for another one of its
	// group when staying would delay its send by more than this.
	MaxDelay Duration `yaml:"max_delay"`
}

func (a *CacheAffinity) withDefaults() {
	if a.TTL == 0 {
		a.TTL = Duration(DefaultAffinityTTL)
	}
	if a.MaxDelay == 0 {
		a.MaxDelay = Duration(DefaultAffinityMaxDelay)
	}
}

func (c *Config) checkAffinity(fail failFunc) {
	a := c.Admission.CacheAffinity
	if a.TTL.D() < time.Second || a.TTL.D() > 24*time.Hour {
		fail("admission.cache_affinity.ttl", "must be between 1s and 24h, got %s", a.TTL.D())
	}
	if a.MaxDelay.D() < 0 || a.MaxDelay.D() > time.Minute {
		fail("admission.cache_affinity.max_delay", "must be between 0 and 1m, got %s", a.MaxDelay.D())
	}
}

// Deployment is one provider's serving of a model name.
type Deployment struct {
	Provider *Provider
	Model    *Model
}

// UpstreamName is the model name sent to the provider: upstream when set,
// else the name callers use.
func (m Model) UpstreamName() string {
	if m.Upstream != "" {
		return m.Upstream
	}
	return m.Name
}

// Group returns the deployments serving model name, in placement
// preference: tier, then weight (higher first), then file order.
func (c *Config) Group(name string) []Deployment {
	var out []Deployment
	for i := range c.Providers {
		p := &c.Providers[i]
		for j := range p.Models {
			if p.Models[j].Name == name {
				out = append(out, Deployment{Provider: p, Model: &p.Models[j]})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Deployment) int {
		if a.Model.Tier != b.Model.Tier {
			return a.Model.Tier - b.Model.Tier
		}
		return b.Model.Weight - a.Model.Weight
	})
	return out
}

// Deployment finds provider's deployment of model name.
func (c *Config) Deployment(provider, name string) (*Provider, *Model, bool) {
	for i := range c.Providers {
		p := &c.Providers[i]
		if p.Name != provider {
			continue
		}
		for j := range p.Models {
			if p.Models[j].Name == name {
				return p, &p.Models[j], true
			}
		}
	}
	return nil, nil, false
}

// kindFamily is what deployments of one model must share of their
// providers' kinds: the request shapes Sluice sends.
func kindFamily(kind string) string {
	if kind == "anthropic" {
		return "anthropic"
	}
	return "openai"
}

// checkDeployment checks a model's deployment keys (tier, weight,
// upstream) at key mk.
func checkDeployment(m Model, mk string, fail failFunc) {
	if m.Tier < 0 || m.Tier > MaxTier {
		fail(mk+".tier", "must be between 0 and %d, got %d", MaxTier, m.Tier)
	}
	if m.Weight < 1 || m.Weight > MaxDeploymentWeight {
		fail(mk+".weight", "must be between 1 and %d, got %d", MaxDeploymentWeight, m.Weight)
	}
	if m.Upstream != "" && !validUpstream(m.Upstream) {
		fail(mk+".upstream", "must be 1-256 characters without spaces or control characters, got %q", clip.String(m.Upstream, 40))
	}
}

func validUpstream(s string) bool {
	if len(s) > 256 {
		return false
	}
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return false
		}
	}
	return true
}

// checkGroups checks that the deployments of each model name agree on
// what callers see of it.
func (c *Config) checkGroups(fail failFunc) {
	first := map[string][2]int{} // model name -> its first deployment's indexes
	for i, p := range c.Providers {
		for j, m := range p.Models {
			at, ok := first[m.Name]
			if !ok {
				first[m.Name] = [2]int{i, j}
				continue
			}
			fp, fm := c.Providers[at[0]], c.Providers[at[0]].Models[at[1]]
			mk := fmt.Sprintf("providers[%d].models[%d]", i, j)
			switch {
			case kindFamily(p.Kind) != kindFamily(fp.Kind):
				fail(mk+".name", "%q is also served by provider %q of kind %s; the deployments of one model take the same requests (anthropic with anthropic, openai-compatible kinds together)", m.Name, fp.Name, fp.Kind)
			case !slices.Equal(m.UnitNames(), fm.UnitNames()):
				fail(mk+".units", "%q names other units than its deployment under provider %q; the deployments of one model limit the same units", m.Name, fp.Name)
			case !slices.Equal(m.AllowFields, fm.AllowFields) || !slices.Equal(m.DenyFields, fm.DenyFields):
				fail(mk+".allow_fields", "%q lets other fields through than its deployment under provider %q; the deployments of one model take the same requests", m.Name, fp.Name)
			}
		}
	}
}

// Grouped reports whether more than one provider serves model name.
func (c *Config) Grouped(name string) bool {
	n := 0
	for i := range c.Providers {
		for j := range c.Providers[i].Models {
			if c.Providers[i].Models[j].Name == name {
				n++
			}
		}
	}
	return n > 1
}
