package config

import "time"

// Cache configures the response cache and the coalescing of identical
// calls (internal/cache). A request is cached only when its caller asks
// (Cache-Control: max-age=N) or Tenants/Models name it, and only when it
// is deterministic; see the README's "Caching and coalescing".
type Cache struct {
	// MaxBytes bounds the cache bucket; when it is full, the oldest
	// entries make room for new ones (default 64 MiB).
	MaxBytes int64 `yaml:"max_bytes"`
	// MaxTTL caps how long any entry lives, whatever the caller asked
	// (default 24h).
	MaxTTL Duration `yaml:"max_ttl"`
	// Tenants and Models turn caching on without the caller asking, with
	// the entry lifetime given: tenant name (or model name) -> TTL. When
	// both name a request, the shorter TTL holds.
	Tenants map[string]Duration `yaml:"tenants"`
	Models  map[string]Duration `yaml:"models"`
	// AllowTools lets requests that carry tools (which the client runs,
	// with effects Sluice cannot see) be cached and coalesced.
	AllowTools bool `yaml:"allow_tools"`
	// CoalesceTenants lists tenants whose identical requests in flight at
	// once share one provider call even when they are not cacheable
	// (cacheable ones always do).
	CoalesceTenants []string `yaml:"coalesce_tenants"`
	// SharedScopes name caches that several tenants share, each listing
	// its tenants: a request opts in with X-Sluice-Cache-Scope: <name>,
	// and only a listed tenant may. Without one, entries are per tenant.
	SharedScopes map[string][]string `yaml:"shared_scopes"`
	// HitsCountInTenantBudget makes a cache hit count as one request (no
	// tokens: no model read or wrote any) in its tenant's rpm and rpd. Off
	// by default: those budgets ration what a tenant draws from the
	// providers' limits and the fleet's calls, and a hit draws on neither;
	// an operator who sells plans by answers turns it on. A hit past the
	// budget is refused for now (429 with Retry-After; an INTAKE job
	// waits), as it has no queue to wait in.
	HitsCountInTenantBudget bool `yaml:"hits_count_in_tenant_budget"`
}

// DefaultCacheBytes is cache.max_bytes when unset.
const DefaultCacheBytes = 64 << 20

// DefaultCacheTTL is cache.max_ttl when unset.
const DefaultCacheTTL = 24 * time.Hour

func (c *Cache) withDefaults() {
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultCacheBytes
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = Duration(DefaultCacheTTL)
	}
}

// checkCache checks cache.*.
func (c *Config) checkCache(fail failFunc) {
	cc := c.Cache
	if cc.MaxBytes < 1<<20 {
		fail("cache.max_bytes", "must be at least 1 MiB, got %d", cc.MaxBytes)
	}
	if cc.MaxTTL.D() < time.Second {
		fail("cache.max_ttl", "must be at least 1s, got %s", cc.MaxTTL.D())
	}
	for name, ttl := range cc.Tenants {
		if _, ok := c.Tenant(name); !ok && name != DefaultTenant {
			fail("cache.tenants."+name, "is not a configured tenant")
		}
		if ttl.D() < time.Second {
			fail("cache.tenants."+name, "must be at least 1s, got %s", ttl.D())
		}
	}
	for name, ttl := range cc.Models {
		if _, _, ok := c.ModelRef(name); !ok {
			fail("cache.models."+name, "is not a configured model")
		}
		if ttl.D() < time.Second {
			fail("cache.models."+name, "must be at least 1s, got %s", ttl.D())
		}
	}
	for name, tenants := range cc.SharedScopes {
		if !validScope(name) {
			fail("cache.shared_scopes."+name, "must be 1-32 of a-z, 0-9, '-' and '_'")
		}
		for _, t := range tenants {
			if _, ok := c.Tenant(t); !ok && t != DefaultTenant {
				fail("cache.shared_scopes."+name, "names %q, not a configured tenant", t)
			}
		}
	}
}

func validScope(s string) bool {
	if len(s) == 0 || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// CacheTTL is the lifetime config gives a tenant's requests to model
// without the caller asking; 0: none.
func (c *Config) CacheTTL(tenant, model string) time.Duration {
	var ttl time.Duration
	for _, d := range []Duration{c.Cache.Tenants[tenant], c.Cache.Models[model]} {
		if d > 0 && (ttl == 0 || d.D() < ttl) {
			ttl = d.D()
		}
	}
	return ttl
}

// CacheScopeAllowed reports whether tenant may use the shared cache scope.
func (c *Config) CacheScopeAllowed(scope, tenant string) bool {
	for _, t := range c.Cache.SharedScopes[scope] {
		if t == tenant {
			return true
		}
	}
	return false
}
