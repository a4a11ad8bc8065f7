// Package api holds the HTTP plumbing the services share: tenant
// authentication, JSON and OpenAI-shaped errors.
package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Auth maps bearer keys (Authorization: Bearer, or x-api-key as
// Anthropic's SDKs send them) to tenants. With no keys configured, Sluice runs open
// (development): the tenant comes from the X-Sluice-Tenant header, or is the
// only configured tenant.
type Auth struct {
	Keys    map[string]string // key -> tenant
	Tenants []string
}

// ErrUnauthorized is a missing or wrong bearer key.
var ErrUnauthorized = errors.New("missing or invalid API key")

// Tenant resolves the caller's tenant.
func (a Auth) Tenant(r *http.Request) (string, error) {
	if len(a.Keys) > 0 {
		h := r.Header.Get("Authorization")
		key, ok := strings.CutPrefix(h, "Bearer ")
		if !ok && h == "" {
			// Anthropic's SDKs send the key as x-api-key.
			key = r.Header.Get("X-Api-Key")
			ok = key != ""
		}
		if !ok {
			return "", ErrUnauthorized
		}
		t, ok := a.Keys[strings.TrimSpace(key)]
		if !ok {
			return "", ErrUnauthorized
		}
		return t, nil
	}
	if t := r.Header.Get("X-Sluice-Tenant"); t != "" {
		for _, known := range a.Tenants {
			if known == t {
				return t, nil
			}
		}
		return "", &job.ValidationError{Code: job.CodeUnknownTenant, Field: "X-Sluice-Tenant", Message: "unknown tenant"}
	}
	if len(a.Tenants) == 1 {
		return a.Tenants[0], nil
	}
	return "", &job.ValidationError{Code: job.CodeUnknownTenant, Field: "X-Sluice-Tenant", Message: "is required when several tenants are configured and no API keys are set"}
}

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
	case job.CodeQueueFull:
		return http.StatusTooManyRequests
	case job.CodeDeadlineExpired:
		return http.StatusGatewayTimeout
	case job.CodeUnknownModel:
		return http.StatusNotFound
	}
	return http.StatusBadRequest
}
