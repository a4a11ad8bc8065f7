package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// POST /v1/responses: OpenAI's Responses API, through the same mesh as
// chat completions. The request is translated to a chat body (package
// wire) and runs as a chat job (endpoint job.EndpointResponses, so a
// provider serving the Responses API natively is called there); the
// answer is translated to a Response object, or to the Responses stream
// events. A response is the job: its id is "resp_" + the job id.
//
// Conversation state lives in the results bucket, under
// responses.<tenant>.<job id>, for limits.result_retention like the job's
// record: the response's request (Meta) and its whole input as Responses
// items. Its output is the job's result. previous_response_id reads
// both back as the next call's history; a key is built from the caller's
// tenant, so another tenant's id (or an expired one) is not found.

// storedResponse is what the results bucket keeps of a stored response:
// its request's Meta and its whole input as Responses items (the
// conversation before it, then its own), as the caller sent them.
type storedResponse struct {
	Meta  wire.Meta         `json:"meta"`
	Items []json.RawMessage `json:"items,omitempty"`
	// Messages is the input of a response stored before items were kept.
	Messages []wire.ChatMessage `json:"messages,omitempty"`
	// Conversation keys the chain of responses this one belongs to (the
	// job's affinity: every turn goes where the last one was served).
	Conversation string `json:"conversation,omitempty"`
}

// items is the stored response's input as items.
func (st *storedResponse) items() []json.RawMessage {
	if len(st.Items) == 0 && len(st.Messages) > 0 {
		return wire.ChatHistoryItems(st.Messages)
	}
	return st.Items
}

// nativeResponses reports whether the request's model is served only by
// providers called on their own Responses API: the deployment it is
// pinned to (X-Sluice-Provider), else every deployment of the model's
// group, since admission may place it on any.
func (s responsesSurface) nativeResponses(r *http.Request, model string) bool {
	if pin := r.Header.Get("X-Sluice-Provider"); pin != "" {
		p, _, ok := s.app().Deployment(pin, model)
		return ok && p.NativeResponses()
	}
	group := s.app().Group(model)
	for _, d := range group {
		if !d.Provider.NativeResponses() {
			return false
		}
	}
	return len(group) > 0
}

// responseKey is the results-bucket key of a tenant's stored response.
func responseKey(tenant, jobID string) string { return keys.Response(tenant, jobID) }

// responseJob is the job id a response id names ("" when it names none).
func responseJob(id string) string {
	jobID, ok := strings.CutPrefix(id, "resp_")
	if !ok || !job.CanonicalID(jobID) {
		return ""
	}
	return jobID
}

// responsesSurface is OpenAI's Responses API: the request becomes a chat
// body (with the conversation a previous response ends), the answer a
// Response object, events the Responses stream's, errors OpenAI's; and
// the stored responses' own endpoints. accepted is the request's, set
// once it is decoded.
type responsesSurface struct {
	*deps
	pipe     *pipeline
	accepted func(jobID string) wire.Meta // the response's metadata once its job is known; it stores the response's record
}

func (s responsesSurface) responses(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	tenant, err := auth.Tenant(r)
	if err != nil {
		s.fail(w, "responses", err)
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.fail(w, "responses", err)
		return
	}
	req, err := wire.ParseRequest(body)
	if err != nil {
		s.invalidResponse(w, err)
		return
	}
	native := s.nativeResponses(r, req.Model)
	if params, types := req.BuiltinTools(); len(params) > 0 && !native {
		s.invalidResponse(w, &wire.Error{Param: params[0], Msg: fmt.Sprintf("built-in tool %q runs only on a provider serving the Responses API natively (responses: native); model %q is translated to another API", clip.String(types[0], 64), clip.String(req.Model, 64))})
		return
	}
	if req.BuiltinChoice() && !native {
		s.invalidResponse(w, &wire.Error{Param: "tool_choice", Msg: fmt.Sprintf("a built-in tool runs only on a provider serving the Responses API natively (responses: native); model %q is translated to another API", clip.String(req.Model, 64))})
		return
	}
	items, err := req.Items()
	if err != nil {
		s.invalidResponse(w, err)
		return
	}
	input, err := wire.ChatMessages(items, native)
	if err != nil {
		s.invalidResponse(w, err)
		return
	}
	var prior []json.RawMessage
	conversation := ""
	if req.PreviousResponseID != "" {
		if prior, conversation, err = s.history(r.Context(), tenant, req.PreviousResponseID); err != nil {
			s.invalidResponse(w, err)
			return
		}
	}
	history := wire.HistoryMessages(prior)
	if len(history)+len(input) == 0 {
		s.invalidResponse(w, &wire.Error{Param: "input", Msg: "holds no message"})
		return
	}
	opts := wire.ChatOptions{}
	if reasoningModel(req.Model) {
		opts.MaxTokensField = "max_completion_tokens"
	}
	if native {
		opts.Native = req.Native(append(wire.UpstreamHistory(prior), wire.UpstreamInput(items)...))
	}
	chat, err := req.ChatBody(history, input, opts)
	if err != nil {
		s.invalidResponse(w, err)
		return
	}
	created := time.Now().Unix()
	stored := storedResponse{Items: append(prior, items...)}
	// Once accepted (the job id known): the response's id, and its record.
	s.accepted = func(jobID string) wire.Meta {
		m := req.Meta("resp_"+jobID, created)
		if req.Stored() {
			stored.Meta = m
			s.storeResponse(r.Context(), tenant, jobID, &stored)
		}
		return m
	}
	if conversation == "" && req.Stored() {
		conversation = newConversation(chat)
	}
	stored.Conversation = conversation
	s.submit(w, r, tenant, chat, conversation)
}

// submit hands the translated request to the pipeline; conversation is
// the chain it belongs to ("": none).
func (s responsesSurface) submit(w http.ResponseWriter, r *http.Request, tenant string, chat []byte, conversation string) {
	wait, release, ok := s.pipe.open(w, r, tenant, s)
	if !ok {
		return
	}
	defer release()
	err := s.checkBuilt(chat)
	var j *task.Task
	if err == nil {
		j, err = decodeChat(r, tenant, chat, job.EndpointResponses)
	}
	if err != nil {
		s.failed(w, s.failure(w, "openai", err))
		return
	}
	if conversation != "" && j.Affinity == "" {
		// The chain's turns go where the last one was served, while it
		// has room (the provider's prompt cache holds the prefix).
		j.Affinity = conversation
	}
	s.pipe.submit(w, r, s, j, chat, wait)
}

// completed answers a chat.completion as a response.
func (s responsesSurface) completed(w http.ResponseWriter, jobID string, body []byte) {
	out, err := wire.FromChat(s.accepted(jobID), body)
	if err != nil {
		api.Error(w, http.StatusBadGateway, "sluice_error", "bad_response", "the provider's answer could not be translated to a response")
		return
	}
	api.JSON(w, http.StatusOK, out)
}

func (responsesSurface) failed(w http.ResponseWriter, e apiError) { writeOpenAIError(w, e) }
func (responsesSurface) resulted(http.Header, *job.Result)        {}

// events is the Responses stream of job jobID.
func (s responsesSurface) events(jobID string) eventFormat {
	return &responsesEvents{start: func() *wire.Events { return wire.NewEvents(s.accepted(jobID)) }}
}

// invalidResponse answers a request that cannot be translated or whose
// previous response is not there, in OpenAI's error shape.
func (s responsesSurface) invalidResponse(w http.ResponseWriter, err error) {
	var we *wire.Error
	if errors.As(err, &we) {
		s.m.JobsRejected.WithLabelValues("responses", job.CodeInvalidRequest).Inc()
		api.ErrorParam(w, http.StatusBadRequest, "invalid_request_error", job.CodeInvalidRequest, we.Param, we.Error())
		return
	}
	var nf *responseNotFound
	if errors.As(err, &nf) {
		s.m.JobsRejected.WithLabelValues("responses", "previous_response_not_found").Inc()
		api.ErrorParam(w, http.StatusNotFound, "invalid_request_error", "previous_response_not_found", "previous_response_id", nf.Error())
		return
	}
	s.fail(w, "responses", err)
}

// newConversation is a new chain's key, from its first request: a
// retry of that request keys alike, and so do chains that start alike,
// whose prefix the same cache holds.
func newConversation(chat []byte) string {
	h := sha256.Sum256(chat)
	return "conv_" + hex.EncodeToString(h[:16])
}

// responseNotFound: a response id names no response the tenant has.
type responseNotFound struct{ id string }

func (e *responseNotFound) Error() string {
	return fmt.Sprintf("Response with id '%s' not found.", clip.String(e.id, 64))
}

// storeResponse writes a response's record. A failure is logged: the
// response is still answered, only not retrievable.
func (s responsesSurface) storeResponse(ctx context.Context, tenant, jobID string, st *storedResponse) {
	data, err := json.Marshal(st)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, err = s.mesh.Results.Put(ctx, responseKey(tenant, jobID), data)
	}
	if err != nil {
		s.log.Warn("responses: store", "job_id", jobID, "err", err)
	}
}

// loadResponse reads a tenant's stored response and its job's result
// (nil while the job runs).
func (s responsesSurface) loadResponse(ctx context.Context, tenant, id string) (*storedResponse, *job.Result, error) {
	jobID := responseJob(id)
	if jobID == "" {
		return nil, nil, &responseNotFound{id}
	}
	e, err := s.mesh.Results.Get(ctx, responseKey(tenant, jobID))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, nil, &responseNotFound{id}
	}
	if err != nil {
		return nil, nil, err
	}
	var st storedResponse
	if json.Unmarshal(e.Value(), &st) != nil {
		return nil, nil, &responseNotFound{id}
	}
	rec, _, err := s.mesh.Lookup(ctx, tenant, jobID)
	if err != nil && !errors.Is(err, job.ErrNotFound) {
		return nil, nil, err
	}
	if rec != nil && rec.Tenant != tenant {
		return nil, nil, &responseNotFound{id}
	}
	if rec != nil && rec.Result != nil {
		return &st, rec.Result, nil
	}
	if res, err := s.mesh.StoredResult(ctx, tenant, jobID); err == nil {
		return &st, res, nil
	}
	return &st, nil, nil
}

// history is the conversation a previous response ends, as items: its
// input, then its output.
func (s responsesSurface) history(ctx context.Context, tenant, id string) (items []json.RawMessage, conversation string, err error) {
	st, res, err := s.loadResponse(ctx, tenant, id)
	if err != nil {
		return nil, "", err
	}
	if res == nil || res.Status != job.StatusSucceeded {
		state := "is still in progress"
		if res != nil {
			state = "did not complete (" + string(res.Status) + ")"
		}
		return nil, "", &wire.Error{Param: "previous_response_id", Msg: fmt.Sprintf("response '%s' %s; a conversation continues from a completed response", clip.String(id, 64), state)}
	}
	out, err := wire.FromChat(st.Meta, res.Response)
	if err != nil {
		return nil, "", &wire.Error{Param: "previous_response_id", Msg: "the previous response's answer cannot be read"}
	}
	items = append(items, st.items()...)
	for _, it := range out["output"].([]map[string]any) {
		b, err := json.Marshal(it)
		if err != nil {
			return nil, "", err
		}
		items = append(items, b)
	}
	if conversation = st.Conversation; conversation == "" {
		conversation = id
	}
	return items, conversation, nil
}

// responseObject renders a stored response as it stands.
func responseObject(st *storedResponse, res *job.Result) map[string]any {
	if res == nil {
		return wire.Response(st.Meta, wire.StatusInProgress, nil, nil, "", nil)
	}
	switch res.Status {
	case job.StatusSucceeded:
		if out, err := wire.FromChat(st.Meta, res.Response); err == nil {
			return out
		}
	case job.StatusInterrupted:
		if out, err := wire.FromChat(st.Meta, res.Response); err == nil {
			out["status"], out["incomplete_details"] = wire.StatusIncomplete, map[string]any{"reason": wire.ReasonInterrupted}
			return out
		}
		return wire.Response(st.Meta, wire.StatusIncomplete, nil, nil, wire.ReasonInterrupted, nil)
	case job.StatusCancelled:
		return wire.Response(st.Meta, wire.StatusCancelled, nil, nil, "", nil)
	}
	f := &wire.Failure{Code: string(res.Status), Message: "the response did not complete"}
	if res.Error != nil {
		f.Code, f.Message = res.Error.Code, res.Error.Message
	}
	return wire.Response(st.Meta, wire.StatusFailed, nil, nil, "", f)
}

// GET /v1/responses/{id}
func (s responsesSurface) getResponse(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	tenant, err := auth.Tenant(r)
	if err != nil {
		s.fail(w, "responses", err)
		return
	}
	id := r.PathValue("id")
	st, res, err := s.loadResponse(r.Context(), tenant, id)
	if err != nil {
		s.notFoundOr(w, err)
		return
	}
	api.JSON(w, http.StatusOK, responseObject(st, res))
}

// DELETE /v1/responses/{id}: the stored response is forgotten (the job's
// own record stays for its retention).
func (s responsesSurface) deleteResponse(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	tenant, err := auth.Tenant(r)
	if err != nil {
		s.fail(w, "responses", err)
		return
	}
	id := r.PathValue("id")
	if _, _, err := s.loadResponse(r.Context(), tenant, id); err != nil {
		s.notFoundOr(w, err)
		return
	}
	if err := s.mesh.Results.Delete(r.Context(), responseKey(tenant, responseJob(id))); err != nil {
		s.fail(w, "responses", err)
		return
	}
	api.JSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
}

func (s responsesSurface) notFoundOr(w http.ResponseWriter, err error) {
	var nf *responseNotFound
	if errors.As(err, &nf) {
		api.ErrorParam(w, http.StatusNotFound, "invalid_request_error", "not_found", "id", nf.Error())
		return
	}
	s.fail(w, "responses", err)
}

// responsesEvents is the Responses API's stream (wire.Events), built when
// the first event is written: the job is accepted by then, so the
// response has its id.
type responsesEvents struct {
	e     *wire.Events
	start func() *wire.Events
}

func (f *responsesEvents) events() *wire.Events {
	if f.e == nil {
		f.e = f.start()
	}
	return f.e
}

func write(w io.Writer, b []byte) bool {
	if len(b) == 0 {
		return true
	}
	_, err := w.Write(b)
	return err == nil
}

func (f *responsesEvents) chunk(w io.Writer, c []byte) bool { return write(w, f.events().Chunk(c)) }
func (f *responsesEvents) done(w io.Writer) bool            { return write(w, f.events().Done()) }
func (f *responsesEvents) fail(w io.Writer, typ, code, msg string, _ int, rid string) bool {
	if rid != "" {
		msg += " (request " + rid + ")" // a Responses failure has no field for it
	}
	return write(w, f.events().Fail(typ == "sluice_"+string(job.StatusInterrupted), code, msg))
}
func (f *responsesEvents) keepAlive(w io.Writer) bool {
	_, err := io.WriteString(w, ": keep-alive\n\n")
	return err == nil
}
