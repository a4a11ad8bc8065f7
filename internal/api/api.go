// Package api holds the HTTP plumbing the services share: tenant
// authentication, JSON and OpenAI-shaped errors.
package api

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Auth resolves the caller's tenant from its API key: `Authorization:
// Bearer <key>` (the scheme in any case) or `x-api-key: <key>` (what the
// Anthropic SDKs send). Keys are held as SHA-256 digests and a presented
// key is hashed before the lookup, so the time a check takes does not
// depend on how much of a real key the caller guessed. Build one with
// NewAuth or NewKeyAuth; copies share their keys, which Set replaces
// (a reload) for every copy at once. The zero value refuses every request.
type Auth struct {
	// Open is development mode: a request without a key acts as the tenant
	// X-Sluice-Tenant names, or as the only tenant. A request with a key
	// is checked all the same.
	Open bool
	// Tenants are the tenant names of an Auth built as a literal (tests);
	// NewAuth's hold theirs in the table Set replaces.
	Tenants []string
	t       *atomic.Pointer[authTable]
}

// Key is what an API key grants.
type Key struct {
	Tenant  string
	Expires time.Time // zero: never
	Models  []string  // the models it may call; empty: all
}

type authTable struct {
	tenants []string
	keys    map[[sha256.Size]byte]Key // digest of key -> grant
}

// NewAuth builds an Auth from key -> tenant: keys without expiry or
// model lists.
func NewAuth(keys map[string]string, tenants []string, open bool) Auth {
	ks := make(map[string]Key, len(keys))
	for k, t := range keys {
		ks[k] = Key{Tenant: t}
	}
	return NewKeyAuth(ks, tenants, open)
}

// NewKeyAuth builds an Auth from key -> grant.
func NewKeyAuth(keys map[string]Key, tenants []string, open bool) Auth {
	a := Auth{Open: open, t: new(atomic.Pointer[authTable])}
	a.Set(keys, tenants)
	return a
}

// Set replaces the keys and tenants of a and of every copy of it.
func (a Auth) Set(keys map[string]Key, tenants []string) {
	t := &authTable{tenants: slices.Clone(tenants), keys: make(map[[sha256.Size]byte]Key, len(keys))}
	for k, g := range keys {
		t.keys[sha256.Sum256([]byte(k))] = g
	}
	a.t.Store(t)
}

func (a Auth) table() *authTable {
	if a.t == nil {
		return &authTable{tenants: a.Tenants}
	}
	if t := a.t.Load(); t != nil {
		return t
	}
	return &authTable{}
}

// Keys reports how many API keys the Auth knows.
func (a Auth) Keys() int { return len(a.table().keys) }

// ExpiredError is a known key past its expiry; it is an ErrUnauthorized.
type ExpiredError struct{ At time.Time }

func (e *ExpiredError) Unwrap() error { return ErrUnauthorized }

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("this API key expired at %s; use the tenant's newer key", e.At.UTC().Format(time.RFC3339))
}

// ErrUnauthorized is a missing or wrong API key.
var ErrUnauthorized = errors.New("missing or invalid API key")

// BearerKey returns the credentials of an Authorization header value with
// the Bearer scheme, matched in any case (RFC 9110 makes auth schemes
// case-insensitive); ok is false for another scheme or no credentials.
func BearerKey(h string) (key string, ok bool) {
	h = strings.TrimLeft(h, " \t")
	i := strings.IndexAny(h, " \t")
	if i < 0 || !strings.EqualFold(h[:i], "bearer") {
		return "", false
	}
	key = strings.TrimSpace(h[i:])
	return key, key != ""
}

// presentedKey is the key a request carries, if any: Authorization first,
// then x-api-key. A request that sends an Authorization header of another
// scheme and no x-api-key presents an unusable key ("", true).
func presentedKey(r *http.Request) (key string, present bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		if k, ok := BearerKey(h); ok {
			return k, true
		}
		if k := strings.TrimSpace(r.Header.Get("X-Api-Key")); k != "" {
			return k, true
		}
		return "", true
	}
	if k := strings.TrimSpace(r.Header.Get("X-Api-Key")); k != "" {
		return k, true
	}
	return "", false
}

// Tenant resolves the caller's tenant.
func (a Auth) Tenant(r *http.Request) (string, error) {
	g, err := a.grant(r)
	return g.Tenant, err
}

// grant resolves what the caller's key grants.
func (a Auth) grant(r *http.Request) (Key, error) {
	t := a.table()
	if key, present := presentedKey(r); present {
		if key == "" {
			return Key{}, ErrUnauthorized
		}
		g, ok := t.keys[sha256.Sum256([]byte(key))]
		switch {
		case !ok:
			return Key{}, ErrUnauthorized
		case !g.Expires.IsZero() && !time.Now().Before(g.Expires):
			return Key{}, &ExpiredError{At: g.Expires}
		}
		return g, nil
	}
	if !a.Open {
		return Key{}, ErrUnauthorized
	}
	if name := r.Header.Get("X-Sluice-Tenant"); name != "" {
		if slices.Contains(t.tenants, name) {
			return Key{Tenant: name}, nil
		}
		return Key{}, &job.ValidationError{Code: job.CodeUnknownTenant, Field: "X-Sluice-Tenant", Message: "unknown tenant"}
	}
	if len(t.tenants) == 1 {
		return Key{Tenant: t.tenants[0]}, nil
	}
	return Key{}, &job.ValidationError{Code: job.CodeUnknownTenant, Field: "X-Sluice-Tenant", Message: "is required in open mode when several tenants are configured and the request has no API key"}
}

type modelsKey struct{}

// Scoped returns r with the models its key may call in its context
// (ModelAllowed reads them), when its key names some.
func (a Auth) Scoped(r *http.Request) *http.Request {
	g, err := a.grant(r)
	if err != nil || len(g.Models) == 0 {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), modelsKey{}, g.Models))
}

// ModelAllowed reports whether the key of the request ctx came from may
// call model (always, for a key without a model list).
func ModelAllowed(ctx context.Context, model string) bool {
	ms, ok := ctx.Value(modelsKey{}).([]string)
	return !ok || slices.Contains(ms, model)
}

// AuthError answers a request Tenant refused: 401 for a missing or wrong
// key, 403 for an unknown tenant (open mode).
func AuthError(w http.ResponseWriter, err error) {
	var ve *job.ValidationError
	if errors.As(err, &ve) {
		Error(w, StatusFor(ve.Code), "invalid_request_error", ve.Code, ve.Error())
		return
	}
	var ee *ExpiredError
	if errors.As(err, &ee) {
		Error(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", ee.Error())
		return
	}
	Error(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", ErrUnauthorized.Error())
}

// ParseWait reads a wait a caller asks for (X-Sluice-Wait-Timeout, ?wait=):
// a Go duration ("30s", "2m") or a decimal number of seconds ("30",
// "1.5"). It must be positive (zero too when allowZero) and at most max;
// exponents, NaN, infinities and values that overflow a time.Duration are
// refused.
func ParseWait(v string, max time.Duration, allowZero bool) (time.Duration, error) {
	bad := fmt.Errorf("must be a positive duration such as 30s, or seconds, at most %s", max)
	d, err := time.ParseDuration(v)
	if err != nil {
		if !decimal(v) {
			return 0, bad
		}
		n, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil || math.IsNaN(n) || math.IsInf(n, 0) {
			return 0, bad
		}
		if n > max.Seconds() {
			return 0, fmt.Errorf("is above the limit of %s (limits.max_wait)", max)
		}
		d = time.Duration(n * float64(time.Second))
	}
	if d < 0 || (d == 0 && !allowZero) {
		return 0, bad
	}
	if d > max {
		return 0, fmt.Errorf("is above the limit of %s (limits.max_wait)", max)
	}
	return d, nil
}

// decimal reports whether s is digits with at most one decimal point: no
// sign, exponent, hex, NaN or Inf.
func decimal(s string) bool {
	digits, dot := 0, false
	for _, r := range s {
		switch {
		case r >= '0' && r <= '9':
			digits++
		case r == '.' && !dot:
			dot = true
		default:
			return false
		}
	}
	return digits > 0
}

// ExtendDeadlines lets one request outlive the server's read and write
// timeouts by d: a chat completion or a long-poll that waits for a result
// would otherwise be cut by WriteTimeout, and ReadTimeout would end the
// connection's background read and so cancel the request's context. The
// caller has read the body already.
func ExtendDeadlines(w http.ResponseWriter, d time.Duration) {
	rc := http.NewResponseController(w)
	at := time.Now().Add(d)
	_ = rc.SetReadDeadline(at)
	_ = rc.SetWriteDeadline(at)
}

// Waiters counts, per tenant, the requests waiting for a result in this
// process, and refuses more than a limit: each waiter holds a goroutine and
// a NATS subscription.
type Waiters struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

// NewWaiters allows max waiters per tenant.
func NewWaiters(max int) *Waiters { return &Waiters{max: max, n: map[string]int{}} }

// Max is the limit per tenant.
func (w *Waiters) Max() int { return w.max }

// Acquire takes a waiter slot for tenant; ok is false when the tenant has
// max waiters already. Call release once when the wait ends.
func (w *Waiters) Acquire(tenant string) (release func(), ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n[tenant] >= w.max {
		return nil, false
	}
	w.n[tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.n[tenant]--; w.n[tenant] <= 0 {
				delete(w.n, tenant)
			}
		})
	}, true
}

// TooManyWaiters answers a request refused by Waiters: 429, retry after a
// second.
func TooManyWaiters(w http.ResponseWriter, max int) {
	RetryAfter(w, time.Second)
	Error(w, http.StatusTooManyRequests, "sluice_error", CodeTooManyWaiters, TooManyWaitersMessage(max))
}

// TooManyWaitersMessage is the message of TooManyWaiters' answer, for an
// API that answers errors in a shape of its own.
func TooManyWaitersMessage(max int) string {
	return fmt.Sprintf("this tenant already has %d requests waiting for results on this server (limits.max_waiters_per_tenant); retry when one ends", max)
}

// CodeTooManyWaiters refuses a wait beyond limits.max_waiters_per_tenant.
const CodeTooManyWaiters = "too_many_waiters"

// NoRetry tells the official OpenAI and Anthropic SDKs not to retry this
// answer (they honour x-should-retry over the status code).
func NoRetry(w http.ResponseWriter) { w.Header().Set("X-Should-Retry", "false") }

// JSON writes v with status.
func JSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Error writes an OpenAI-shaped error body.
func Error(w http.ResponseWriter, status int, typ, code, msg string) {
	JSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": code, "param": nil}})
}

// RetryAfter sets both Retry-After (seconds, rounded up) and retry-after-ms.
func RetryAfter(w http.ResponseWriter, d time.Duration) {
	if d < time.Second {
		d = time.Second
	}
	w.Header().Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
	w.Header().Set("retry-after-ms", strconv.FormatInt(d.Milliseconds(), 10))
}

// StatusFor maps a Sluice error code to an HTTP status.
func StatusFor(code string) int {
	switch code {
	case job.CodeUnknownTenant:
		return http.StatusForbidden
	case job.CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case job.CodeQueueFull, job.CodeSpendBudget:
		return http.StatusTooManyRequests
	case job.CodeUnknownModel:
		return http.StatusNotFound
	case CodeUnsupportedMediaType:
		return http.StatusUnsupportedMediaType
	case job.CodeIdempotencyMismatch:
		return http.StatusUnprocessableEntity
	}
	return http.StatusBadRequest
}
