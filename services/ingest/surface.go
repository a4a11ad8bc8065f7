package ingest

import (
	"net/http"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/pkg/job"
)

// A surface is one HTTP API on the submit-and-wait pipeline (chat
// completions and embeddings, messages, responses; the jobs API takes
// envelopes and waits for nothing). Its handler decodes the API's request
// into a job (a chat body, translated when the API is not OpenAI's) and
// hands it to the pipeline; the pipeline answers through the surface's
// renderers, in the API's shapes. No surface calls another's handler.
type surface interface {
	// completed answers a successful call: body is the chat.completion
	// (or embeddings list) of job jobID ("" for a cache hit).
	completed(w http.ResponseWriter, jobID string, body []byte)
	// failed answers an error; the headers it carries (Retry-After,
	// X-Should-Retry) are set already.
	failed(w http.ResponseWriter, e apiError)
	// resulted adds the API's own headers to a job's result headers
	// (resultHeaders) before completed or failed answers it.
	resulted(h http.Header, res *job.Result)
	// events is the stream format of job jobID's events.
	events(jobID string) eventFormat
}

// apiError is an error answer before it takes its API's shape: the HTTP
// status, OpenAI's type, code and param, the message, and for a job
// refused for now the queue's state (busyError).
type apiError struct {
	status                int
	typ, code, param, msg string
	queue                 map[string]any
}

// writeOpenAIError answers e in OpenAI's shape:
// {"error":{"message","type","code","param"}}.
func writeOpenAIError(w http.ResponseWriter, e apiError) {
	body := map[string]any{"message": e.msg, "type": e.typ, "code": e.code, "param": nil}
	if e.param != "" {
		body["param"] = e.param
	}
	if e.queue != nil {
		body["queue"] = e.queue
	}
	api.JSON(w, e.status, map[string]any{"error": body})
}
