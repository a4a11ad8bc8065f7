package ingest

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// checkContentType refuses a body that is not declared JSON. A browser
// sends a cross-site POST without asking first (no CORS preflight) only
// with a form or text/plain body, or none declared; requiring
// application/json keeps such a request from reaching a local Sluice.
func checkContentType(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))) {
		if cs, ok := params["charset"]; !ok || strings.EqualFold(cs, "utf-8") {
			return nil
		}
	}
	got := "none"
	if ct != "" {
		got = fmt.Sprintf("%q", clip.String(ct, 64))
	}
	return &job.ValidationError{Code: api.CodeUnsupportedMediaType, Field: "Content-Type",
		Message: fmt.Sprintf("must be application/json (UTF-8), got %s", got)}
}

// checkUTF8 refuses a body that is not UTF-8, as JSON text must be
// (RFC 8259): Go's JSON decoder would read the invalid bytes as U+FFFD,
// but the body is forwarded as it came, so the provider would see what
// Sluice did not.
func checkUTF8(body []byte) error {
	if utf8.Valid(body) {
		return nil
	}
	off := 0
	for off < len(body) {
		r, n := utf8.DecodeRune(body[off:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		off += n
	}
	return &job.ValidationError{Code: job.CodeInvalidRequest,
		Message: fmt.Sprintf("body is not valid UTF-8 (invalid byte at offset %d); JSON text must be UTF-8", off)}
}

// checkBody refuses, before anything reads the body of a request to a
// submit-and-wait endpoint, what would let Sluice and the provider read
// it differently: members named alike (job.CheckMembers); and, unless
// the body is the one Sluice's /v1/responses surface built (endpoint
// job.EndpointResponses, which no caller sets), a member only Sluice
// sets. A job envelope's request gets the same checks from job.Parse.
func checkBody(body []byte, endpoint string) error {
	if err := job.CheckMembers("request", body, nil); err != nil {
		return err
	}
	if endpoint == job.EndpointResponses {
		return nil
	}
	return job.CheckProducerRequest("request", body)
}

// checkBuilt checks a chat body a surface built from its API's request
// as readBody checks one that came as it is: its size (a translation
// can outgrow the request) and its encoding.
func (s *deps) checkBuilt(body []byte) error {
	if len(body) > s.lim.MaxBodyBytes {
		return &job.ValidationError{Code: job.CodeTooLarge, Message: fmt.Sprintf("body is over the %d-byte limit", s.lim.MaxBodyBytes)}
	}
	return checkUTF8(body)
}

// canonicalBody is a request body as QUEUE and DISPATCH carry it:
// encoding/json writes a json.RawMessage compacted, with <, > and & (and
// U+2028, U+2029) escaped. The seal binds the body's hash and every later
// hop reads these bytes, so they are the ones sealed; a body sealed as it
// came (indented, or with spaces after colons, as many clients send it)
// would never verify and be estimated again at every delivery. A body that
// is not JSON is kept as it is, for the estimate to refuse.
func canonicalBody(b json.RawMessage) json.RawMessage {
	out, err := json.Marshal(b)
	if err != nil {
		return b
	}
	return out
}

// errIdempotencyMismatch refuses a submission whose idempotency key names
// an operation submitted with another request (422, as Stripe answers).
var errIdempotencyMismatch = &job.ValidationError{Code: job.CodeIdempotencyMismatch, Field: "idempotency_key",
	Message: "was used before with a different request: an idempotency key names one operation; use a new key for a new request"}
