package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
)

// Request ids: every answer of the HTTP API names the request, refusals,
// cache hits and stream error events included, so that a caller's report
// and the operator's logs meet. X-Sluice-Request-Id is always Sluice's
// own id; X-Request-Id is the provider's request id when a provider
// answered the call (the official SDKs show it on errors and results), and
// Sluice's otherwise.
const (
	HeaderRequestID       = "X-Request-Id"
	HeaderSluiceRequestID = "X-Sluice-Request-Id"
)

type requestIDKey struct{}

// WithRequestID gives every request an id (req_ and 24 hex digits), on
// its answer's headers and on its context (RequestID).
func WithRequestID(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := NewRequestID()
		w.Header().Set(HeaderRequestID, id)
		w.Header().Set(HeaderSluiceRequestID, id)
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id)))
	})
}

// NewRequestID makes a request id.
func NewRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "req_" + hex.EncodeToString(b[:])
}

// RequestID is the id WithRequestID gave the request of ctx ("": none).
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}
