// Package cache is Sluice's response cache and the coalescing of identical
// calls. An answer is stored only for a request that asked for it (or whose
// tenant or model config does) and that is deterministic enough to be
// answered twice the same way; the entry lives in the cache bucket, keyed
// by the tenant (or a shared scope the config allows), the endpoint, the
// provider-facing model configuration, the prompt version and the
// canonical request, with its own TTL. Identical requests in flight at
// once share one provider call by sharing an idempotency key, which joins
// them fleet-wide through the operation record (services/ingest).
package cache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Headers a caller steers the cache with.
const (
	// Header answers HIT, MISS or BYPASS; on a request, "force" lets a
	// request that asks for caching be cached though it is not
	// deterministic by its own fields.
	Header = "X-Sluice-Cache"
	// ScopeHeader names a shared scope (config cache.shared_scopes) to
	// read and write instead of the tenant's own entries.
	ScopeHeader = "X-Sluice-Cache-Scope"
	// PromptVersionHeader is part of the key: the caller's name for the
	// version of its prompt templates, tools or schemas.
	PromptVersionHeader = "X-Sluice-Prompt-Version"
)

// Results of a request, in X-Sluice-Cache and the metric's label.
const (
	Hit    = "HIT"
	Miss   = "MISS"
	Bypass = "BYPASS"
)

// keyVersion changes when the key's derivation does, so old entries are
// simply never found.
const keyVersion = "sluice-cache-v1"

// Request is what a plan is made from.
type Request struct {
	App    *config.Config
	Tenant string
	// Endpoint is the job's (job.EndpointChat, "" for chat too).
	Endpoint string
	// Ask is what the caller asked (AskFromHeader over HTTP, the
	// envelope's cache member); nil: nothing.
	Ask *job.CacheOptions
	// Body is the chat-completions body (for /v1/messages, as translated:
	// the call the provider gets, so both surfaces share entries).
	Body []byte
	// IdempotencyKey is the caller's own; with one, the caller's key
	// decides what joins, not the cache.
	IdempotencyKey string
}

// AskFromHeader reads what an HTTP request asks of the cache:
// Cache-Control (max-age=N, no-cache, no-store), X-Sluice-Cache: force,
// X-Sluice-Prompt-Version and X-Sluice-Cache-Scope. It returns nil when
// none is there.
func AskFromHeader(h http.Header) (*job.CacheOptions, error) {
	cc, err := parseCacheControl(h.Values("Cache-Control"))
	if err != nil {
		return nil, err
	}
	a := &job.CacheOptions{TTL: int64(cc.maxAge / time.Second), NoCache: cc.noCache, NoStore: cc.noStore,
		PromptVersion: h.Get(PromptVersionHeader), Scope: h.Get(ScopeHeader)}
	switch v := strings.ToLower(strings.TrimSpace(h.Get(Header))); v {
	case "":
	case "force":
		a.Force = true
	default:
		return nil, &job.ValidationError{Code: job.CodeInvalidRequest, Field: Header, Message: fmt.Sprintf("%q is not understood (want force)", clip.String(v, 64))}
	}
	if *a == (job.CacheOptions{}) {
		return nil, nil
	}
	return a, nil
}

// Plan is what the cache does for one request.
type Plan struct {
	// Asked: the caller or the config asked for caching; only then does
	// the answer carry X-Sluice-Cache.
	Asked bool
	// Cacheable: asked, deterministic, and free of tools the client runs.
	Cacheable bool
	// Read and Write: look the answer up (no Cache-Control: no-cache),
	// store it (no no-store).
	Read, Write bool
	TTL         time.Duration
	// Key is the entry's key in the cache bucket.
	Key string
	// Coalesce is the idempotency key that joins identical requests in
	// flight at once; "" when they are not joined.
	Coalesce string
	// Stream and Usage are the request's stream flag and whether it asked
	// for the usage chunk.
	Stream, Usage bool
	Model         string
	// Why says why a request that asked is not cacheable.
	Why string
}

// body is what the plan reads of a chat body.
type body struct {
	Model         string          `json:"model"`
	Temperature   json.RawMessage `json:"temperature"`
	Seed          json.RawMessage `json:"seed"`
	Tools         json.RawMessage `json:"tools"`
	Functions     json.RawMessage `json:"functions"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// ignored are the body's members that do not change the answer: a
// streamed and an unstreamed call, or two end users, share an entry.
var ignored = []string{"stream", "stream_options", "user", "metadata"}

// MaxPromptVersion bounds X-Sluice-Prompt-Version.
const MaxPromptVersion = 128

// Decide makes the plan for a request. It returns nil when the cache has
// nothing to do with it (not asked, not coalesced), and a
// *job.ValidationError for a cache option it cannot honour.
func Decide(r Request) (*Plan, error) {
	var ask job.CacheOptions
	if r.Ask != nil {
		ask = *r.Ask
	}
	if ask.TTL < 0 {
		return nil, &job.ValidationError{Code: job.CodeInvalidRequest, Field: "cache.ttl", Message: "must be a whole number of seconds, 0 or more"}
	}
	if len(ask.PromptVersion) > MaxPromptVersion {
		return nil, &job.ValidationError{Code: job.CodeInvalidRequest, Field: PromptVersionHeader, Message: fmt.Sprintf("is over %d bytes", MaxPromptVersion)}
	}
	scope := "t." + r.Tenant
	if s := ask.Scope; s != "" {
		if !r.App.CacheScopeAllowed(s, r.Tenant) {
			// The same answer for a scope that does not exist and one the
			// tenant is not in: the names are not probed this way.
			return nil, &job.ValidationError{Code: job.CodeInvalidRequest, Field: ScopeHeader, Message: "is not a shared cache scope this tenant may use (config cache.shared_scopes)"}
		}
		scope = "s." + s
	}
	force := ask.Force
	cc := cacheControl{maxAge: time.Duration(min(ask.TTL, 1<<32)) * time.Second, noCache: ask.NoCache, noStore: ask.NoStore}
	if r.Endpoint != "" && r.Endpoint != job.EndpointChat {
		return nil, nil // chat answers only
	}
	var b body
	if json.Unmarshal(r.Body, &b) != nil {
		return nil, nil // accept refuses it, with the reason
	}
	prov, model, ok := r.App.ModelRef(b.Model)
	if !ok {
		return nil, nil
	}
	p := &Plan{Model: model.Name, Stream: b.Stream, Usage: b.Stream && b.StreamOptions != nil && b.StreamOptions.IncludeUsage}
	ttl := r.App.CacheTTL(r.Tenant, model.Name)
	if cc.maxAge > 0 {
		ttl = cc.maxAge
	}
	p.Asked = ttl > 0
	if ttl == 0 {
		ttl = r.App.Cache.MaxTTL.D()
	}
	p.TTL = min(ttl, r.App.Cache.MaxTTL.D())
	switch {
	case !p.Asked:
		p.Why = "not asked"
	case present(b.Tools) || present(b.Functions):
		if !r.App.Cache.AllowTools {
			p.Why = "tools"
		}
	}
	if p.Why == "" && !force && !zero(b.Temperature) && !present(b.Seed) {
		p.Why = "not deterministic: set temperature 0 or a seed, or X-Sluice-Cache: force"
	}
	p.Cacheable = p.Why == ""
	p.Read = p.Cacheable && !cc.noCache
	p.Write = p.Cacheable && !cc.noStore
	coalesce := p.Read || (!cc.noCache && slices.Contains(r.App.Cache.CoalesceTenants, r.Tenant))
	if !p.Asked && !coalesce {
		return nil, nil
	}
	canon, err := canonical(job.WithoutMembers(r.Body, ignored...))
	if err != nil {
		return nil, nil
	}
	h := sha256.New()
	endpoint := r.Endpoint
	if endpoint == "" {
		endpoint = job.EndpointChat
	}
	for _, part := range []string{keyVersion, scope, endpoint, modelConfig(r.App, prov, model), ask.PromptVersion} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	h.Write(canon)
	sum := h.Sum(nil)
	p.Key = scope + "." + job.ModelToken(model.Name) + "." + hex.EncodeToString(sum[:16])
	if coalesce && r.IdempotencyKey == "" {
		// The body exactly as sent (not canonical): a job joined under a
		// key must carry the same request as the one it joins.
		c := sha256.New()
		c.Write(sum)
		c.Write([]byte(r.Tenant))
		c.Write([]byte{0})
		c.Write(r.Body)
		p.Coalesce = mesh.CoalescePrefix + hex.EncodeToString(c.Sum(nil)[:16])
	}
	return p, nil
}

// Target is where the executor stores the answer; nil when it is not to
// be stored.
func (p *Plan) Target() *task.CacheTarget {
	if p == nil || !p.Write {
		return nil
	}
	return &task.CacheTarget{Key: p.Key, TTL: p.TTL}
}

// modelConfig is what the provider is called with besides the body: a
// change to any of it makes new entries.
func modelConfig(app *config.Config, p *config.Provider, m *config.Model) string {
	return fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%d", p.Name, p.Kind, p.BaseURL, m.Name, app.Limits.DefaultMaxTokens)
}

type cacheControl struct {
	maxAge           time.Duration
	noCache, noStore bool
}

// parseCacheControl reads the request directives Sluice honours; others
// are ignored, as HTTP caches ignore what they do not know.
func parseCacheControl(values []string) (cacheControl, error) {
	var cc cacheControl
	for _, v := range values {
		for _, d := range strings.Split(v, ",") {
			d = strings.ToLower(strings.TrimSpace(d))
			name, arg, _ := strings.Cut(d, "=")
			switch strings.TrimSpace(name) {
			case "no-cache":
				cc.noCache = true
			case "no-store":
				cc.noStore = true
			case "max-age":
				n, err := strconv.ParseInt(strings.Trim(strings.TrimSpace(arg), `"`), 10, 64)
				if err != nil || n < 0 {
					return cc, &job.ValidationError{Code: job.CodeInvalidRequest, Field: "Cache-Control", Message: "max-age must be a whole number of seconds"}
				}
				if n == 0 {
					cc.noCache = true // nothing stored is fresh enough
				}
				cc.maxAge = time.Duration(min(n, 1<<32)) * time.Second
			}
		}
	}
	return cc, nil
}

func present(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null")) && !bytes.Equal(t, []byte("[]"))
}

// zero reports an explicit numeric 0 (0, 0.0, 0e0).
func zero(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || t[0] == 'n' || t[0] == '"' {
		return false
	}
	f, err := strconv.ParseFloat(string(t), 64)
	return err == nil && f == 0
}

// canonical re-encodes a JSON value with object members sorted and no
// insignificant space; numbers keep their text.
func canonical(data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}
