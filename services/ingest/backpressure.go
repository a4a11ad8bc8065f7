package ingest

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
)

// MaxRetryAfter caps the Retry-After (and retry-after-ms) of a queue_full
// or shed answer over HTTP. The official SDKs sleep whatever Retry-After
// says (the OpenAI Node and Python SDKs up to 60 s, the Go SDKs up to 2
// minutes) and retry twice by default, so an honest 60-second wait left a
// default call silent for two minutes before its caller heard anything. At
// 10 s a default SDK call gives up, or gets in, within about 20 s; a refused
// call costs Sluice about a millisecond, so early retries are cheap. The
// honest wait is in the body (queue.estimated_wait_ms) for callers that
// schedule their own retries; NATS producers get it uncapped.
const MaxRetryAfter = 10 * time.Second

// writeBusy answers a job refused for now (queue_full, shed) in OpenAI's
// shape (busyError).
func writeBusy(w http.ResponseWriter, be *BusyError) { writeOpenAIError(w, busyError(w, be)) }

// busyError is a job refused for now: 429 with Retry-After at most
// MaxRetryAfter and a body that says how long the queue really is.
func busyError(w http.ResponseWriter, be *BusyError) apiError {
	retry := min(be.RetryAfter, MaxRetryAfter)
	api.RetryAfter(w, retry)
	msg := fmt.Sprintf("%s: %d jobs ahead, estimated wait %s; retry after %s",
		be.Message, be.Ahead, be.RetryAfter.Round(100*time.Millisecond), retry.Round(100*time.Millisecond))
	return apiError{status: http.StatusTooManyRequests, typ: "sluice_error", code: be.Code, msg: msg,
		queue: map[string]any{
			"jobs_ahead":        be.Ahead,
			"estimated_wait_ms": be.RetryAfter.Milliseconds(),
			"retry_after_ms":    max(retry, time.Second).Milliseconds(),
		}}
}
