package job

// CacheOptions ask for a job's answer to be cached and reused (the
// envelope's "cache" member; over HTTP, Cache-Control and the
// X-Sluice-Cache* headers say the same). Only a deterministic request
// (temperature 0 or a seed, or Force) without tools is cached, and only a
// complete answer is stored.
type CacheOptions struct {
	// TTL is how long the answer may be reused, in seconds; 0 uses what
	// the config sets for the tenant or model (none: not cached).
	TTL int64 `json:"ttl,omitempty"`
	// NoCache skips the lookup (a fresh answer, still stored); NoStore
	// skips the store.
	NoCache bool `json:"no_cache,omitempty"`
	NoStore bool `json:"no_store,omitempty"`
	// Force caches a request that is not deterministic by its fields.
	Force bool `json:"force,omitempty"`
	// PromptVersion is part of the key: the caller's version of its
	// prompt templates, tools or schemas.
	PromptVersion string `json:"prompt_version,omitempty"`
	// Scope names a shared cache (config cache.shared_scopes) instead of
	// the tenant's own.
	Scope string `json:"scope,omitempty"`
}
