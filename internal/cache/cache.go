package cache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Entry is one stored answer.
type Entry struct {
	// Response is the chat.completion body, as the provider answered.
	Response json.RawMessage `json:"response"`
	Usage    *job.Usage      `json:"usage"`
	Provider string          `json:"provider,omitempty"`
	Model    string          `json:"model,omitempty"`
	StoredAt time.Time       `json:"stored_at"`
	// Expires is when the bucket drops the entry (its TTL); an entry read
	// past it (a clock ahead of the server's) is not used.
	Expires time.Time `json:"expires"`
}

// Cache reads and writes the cache bucket for one process.
type Cache struct {
	kv  jetstream.KeyValue
	m   *Metrics
	log *slog.Logger
	now func() time.Time
	// storeWait bounds a store: the result waits for it.
	storeWait time.Duration
}

// Open binds the cache bucket (streams.Ensure made it).
func Open(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, streams.BucketCache)
	if err != nil {
		return nil, fmt.Errorf("bind bucket %s: %w", streams.BucketCache, err)
	}
	return kv, nil
}

// New makes a cache over the bucket kv, registering its metrics with reg.
func New(kv jetstream.KeyValue, reg prometheus.Registerer, log *slog.Logger) *Cache {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cache{kv: kv, m: newMetrics(reg), log: log.With("component", "cache"), now: time.Now, storeWait: storeWait}
}

// Metrics are the cache's counters.
func (c *Cache) Metrics() *Metrics { return c.m }

// Get returns the entry under key and its age; ok is false when there is
// none (or it cannot be read: a miss, never an error for the caller).
func (c *Cache) Get(ctx context.Context, key string) (e *Entry, age time.Duration, ok bool) {
	kve, err := c.kv.Get(ctx, key)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			c.log.Warn("cache read failed; answering as a miss", "err", err)
		}
		return nil, 0, false
	}
	var ent Entry
	if json.Unmarshal(kve.Value(), &ent) != nil || len(ent.Response) == 0 {
		return nil, 0, false
	}
	now := c.now()
	if !ent.Expires.IsZero() && !now.Before(ent.Expires) {
		return nil, 0, false
	}
	return &ent, max(now.Sub(ent.StoredAt), 0), true
}

// Storable reports whether a result is a complete answer worth keeping:
// succeeded, with usage, and every choice finished by itself (stop, or
// tool calls), not cut at max_tokens, by a filter or mid-stream.
func Storable(res *job.Result) bool {
	if res == nil || res.Status != job.StatusSucceeded || res.Usage == nil || len(res.Response) == 0 {
		return false
	}
	var c struct {
		Choices []struct {
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if json.Unmarshal(res.Response, &c) != nil || len(c.Choices) == 0 {
		return false
	}
	for _, ch := range c.Choices {
		if ch.FinishReason == nil {
			return false
		}
		switch *ch.FinishReason {
		case "stop", "tool_calls", "function_call":
		default:
			return false
		}
	}
	return true
}

// Store keeps a job's answer under its target when res is Storable. The
// target must name the job's tenant's own entries, or a shared scope the
// tenant is in (a target is set by ingest; this holds whatever reached
// the caller), and a TTL within cache.max_ttl. The first answer stored
// stands until it expires.
func (c *Cache) Store(ctx context.Context, app *config.Config, tenant string, t *task.CacheTarget, res *job.Result) {
	if t == nil || !Storable(res) {
		return
	}
	if !mayWrite(app, tenant, t) {
		c.m.stores.WithLabelValues("refused").Inc()
		c.log.Warn("cache target refused: not the job's tenant's", "tenant", tenant)
		return
	}
	now := c.now().UTC()
	data, err := json.Marshal(&Entry{Response: res.Response, Usage: res.Usage, Provider: res.Provider, Model: res.Model, StoredAt: now, Expires: now.Add(t.TTL)})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.storeWait)
	defer cancel()
	_, err = c.kv.Create(ctx, t.Key, data, jetstream.KeyTTL(t.TTL))
	switch {
	case err == nil:
		c.m.stores.WithLabelValues("stored").Inc()
	case errors.Is(err, jetstream.ErrKeyExists):
		c.m.stores.WithLabelValues("exists").Inc()
	default:
		// Unreachable, or an answer larger than the bucket: it is
		// delivered all the same (a full bucket drops its oldest entries
		// to make room, see streams.EvictingBuckets).
		c.m.stores.WithLabelValues("failed").Inc()
		c.log.Debug("answer not cached", "err", err)
	}
}

// storeWait bounds a store: the result waits for it.
const storeWait = 2 * time.Second

// mayWrite checks a target against the job's tenant and the config.
func mayWrite(app *config.Config, tenant string, t *task.CacheTarget) bool {
	if t.TTL < time.Second || t.TTL > app.Cache.MaxTTL.D() {
		return false
	}
	parts := strings.Split(t.Key, ".")
	if len(parts) != 4 {
		return false
	}
	switch parts[0] {
	case "t":
		return parts[1] == tenant
	case "s":
		return app.CacheScopeAllowed(parts[1], tenant)
	}
	return false
}

// Metrics counts what the cache did.
type Metrics struct {
	requests  *prometheus.CounterVec
	coalesced prometheus.Counter
	saved     *prometheus.CounterVec
	savedUSD  *prometheus.CounterVec
	stores    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_cache_requests_total",
			Help: "Requests that asked for caching (or that config caches), by result: hit (answered from the cache), miss (called), bypass (not cacheable, or Cache-Control: no-cache)."}, []string{"result"}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_cache_coalesced_total",
			Help: "Requests that joined an identical call already in flight instead of making their own."}),
		saved: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_cache_tokens_saved_total",
			Help: "Provider tokens not paid for: those of cache hits and of coalesced requests, by tenant, model and kind (prompt, completion)."}, []string{"tenant", "model", "kind"}),
		savedUSD: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_cache_saved_usd_total",
			Help: "Spend not paid, in the configured currency: the tokens of sluice_cache_tokens_saved_total at the model's configured price (models without one are not counted)."}, []string{"tenant", "model"}),
		stores: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_cache_stores_total",
			Help: "Answers offered to the cache, by outcome: stored, exists (stored already), failed (the bucket unreachable, or the answer larger than it), refused (a target not the job's tenant's)."}, []string{"outcome"}),
	}
	for _, r := range []string{"hit", "miss", "bypass"} {
		m.requests.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.coalesced, m.saved, m.savedUSD, m.stores)
	}
	return m
}

// Request counts one request's result (Hit, Miss or Bypass).
func (m *Metrics) Request(result string) {
	switch result {
	case Hit:
		m.requests.WithLabelValues("hit").Inc()
	case Miss:
		m.requests.WithLabelValues("miss").Inc()
	default:
		m.requests.WithLabelValues("bypass").Inc()
	}
}

// Coalesced counts a request that joined a call in flight, and the
// tokens it did not pay for (u may be nil: not known yet).
func (m *Metrics) Coalesced() { m.coalesced.Inc() }

// Saved counts what a tenant's request to model (its configured name) did
// not pay for: the tokens of usage u, and their price when the model has
// one (config providers[].models[].price).
func (m *Metrics) Saved(app *config.Config, tenant, model string, u *job.Usage) {
	if u == nil {
		return
	}
	m.saved.WithLabelValues(tenant, model, "prompt").Add(float64(u.PromptTokens))
	m.saved.WithLabelValues(tenant, model, "completion").Add(float64(u.CompletionTokens))
	if p, mc, ok := app.ModelRef(model); ok {
		if v, priced := app.CostOf(p.Name, mc.Name, "", u); priced {
			m.savedUSD.WithLabelValues(tenant, model).Add(v)
		}
	}
}
