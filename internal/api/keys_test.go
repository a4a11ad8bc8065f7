package api

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A tenant's keys: an expired one is refused with 401 saying so (never
// showing the key), a key's model list scopes the request, and Set
// replaces the keys of every copy of an Auth (a reload).
func TestKeysExpireScopeAndSwap(t *testing.T) {
	t.Parallel()
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	a := NewKeyAuth(map[string]Key{
		"old-secret": {Tenant: "acme", Expires: past},
		"new-secret": {Tenant: "acme", Expires: future, Models: []string{"small"}},
	}, []string{"acme"}, false)
	copyOfA := a // as the handlers hold it
	req := func(key string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.Header.Set("Authorization", "Bearer "+key)
		return r
	}
	_, err := a.Tenant(req("old-secret"))
	var ee *ExpiredError
	if !errors.As(err, &ee) || !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("expired key: got %v, want an ExpiredError that is an ErrUnauthorized", err)
	}
	rec := httptest.NewRecorder()
	AuthError(rec, err)
	if body := rec.Body.String(); rec.Code != http.StatusUnauthorized || !strings.Contains(body, "expired at "+past.UTC().Format(time.RFC3339)) || strings.Contains(body, "old-secret") {
		t.Errorf("expired key answer: %d %s, want 401 saying when it expired, without the key", rec.Code, body)
	}
	if tenant, err := a.Tenant(req("new-secret")); err != nil || tenant != "acme" {
		t.Errorf("new key: got %q, %v, want acme", tenant, err)
	}
	scoped := a.Scoped(req("new-secret"))
	if !ModelAllowed(scoped.Context(), "small") || ModelAllowed(scoped.Context(), "large") {
		t.Error("a key limited to small: want small allowed and large refused")
	}
	if !ModelAllowed(a.Scoped(req("other")).Context(), "large") {
		t.Error("a request without a model list: want every model allowed")
	}
	a.Set(map[string]Key{"rotated": {Tenant: "beta"}}, []string{"beta"})
	if _, err := copyOfA.Tenant(req("new-secret")); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("after Set, a copy still takes the old key: %v", err)
	}
	if tenant, err := copyOfA.Tenant(req("rotated")); err != nil || tenant != "beta" {
		t.Errorf("after Set, a copy: got %q, %v, want beta", tenant, err)
	}
	if _, err := (Auth{}).Tenant(req("rotated")); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("zero Auth: got %v, want refused", err)
	}
}
