// Package job defines Sluice's wire formats: the job envelope producers submit,
// the result envelope callers receive, and the NATS subjects they travel on.
// It does no I/O.
package job

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	jsonv1 "github.com/go-json-experiment/json/v1"
	"github.com/google/uuid"

	"github.com/sluice-dev/sluice/pkg/clip"
)

// Priority is a job's scheduling class.
type Priority string

const (
	Interactive Priority = "interactive"
	Standard    Priority = "standard"
	Batch       Priority = "batch"
)

// Priorities lists every class, highest first.
var Priorities = []Priority{Interactive, Standard, Batch}

// Valid reports whether p is a known class.
func (p Priority) Valid() bool {
	return p == Interactive || p == Standard || p == Batch
}

// Status is a job's state. Only the terminal statuses appear in results.
type Status string

const (
	StatusQueued       Status = "queued"
	StatusSucceeded    Status = "succeeded"
	StatusFailed       Status = "failed"
	StatusExpired      Status = "expired"
	StatusDeadLettered Status = "dead_lettered"
	// StatusInterrupted: a streamed answer broke after its first token
	// reached the caller (a cut, a reset, an idle timeout or an error event
	// from the provider). The result holds the text received; the job is
	// never retried, since replaying would repeat text the caller saw and
	// pay twice.
	StatusInterrupted Status = "interrupted"
	// StatusCancelled: the caller went away (a streaming HTTP client that
	// disconnected) and the provider call was stopped, or never made.
	StatusCancelled Status = "cancelled"
)

// Terminal reports whether s ends a job.
func (s Status) Terminal() bool {
	switch s {
	case StatusSucceeded, StatusFailed, StatusExpired, StatusDeadLettered, StatusInterrupted, StatusCancelled:
		return true
	}
	return false
}

// Job is the envelope a producer publishes to sluice.intake.<tenant> (or POSTs
// to /v1/jobs). Fields after Request are filled in by Sluice as the job moves.
type Job struct {
	ID             string     `json:"id,omitempty"`
	Tenant         string     `json:"tenant"`
	Priority       Priority   `json:"priority,omitempty"`
	IdempotencyKey string     `json:"idempotency_key,omitempty"`
	Deadline       *time.Time `json:"deadline,omitempty"`
	// Task names a route (config routes[].task) for fallbacks; optional.
	Task string `json:"task,omitempty"`
	// Endpoint is the provider API the request is for: "" (or
	// EndpointChat) for chat completions, EndpointEmbeddings for embeddings.
	Endpoint string          `json:"endpoint,omitempty"`
	Request  json.RawMessage `json:"request"`
	// Cost states what the job uses of its model's units besides requests
	// and tokens (config providers[].models[].units), by unit name:
	// {"images": 2}. A unit the model limits and the job does not name
	// costs DefaultUnitCost; naming a unit the model does not limit is
	// refused at ingest.
	Cost map[string]int `json:"cost,omitempty"`
	// AtLeastOnce lets Sluice call the provider again when an attempt's
	// outcome is unknown (its executor lost mid-call, its answer cut): the
	// job may be paid twice. Without it such a job ends outcome_unknown,
	// unless its provider honours idempotency keys.
	AtLeastOnce bool `json:"at_least_once,omitempty"`
	// Cache asks for the answer to be cached and reused (cache.go).
	Cache *CacheOptions `json:"cache,omitempty"`
	// Affinity keys a conversation: jobs with the same key (per tenant and
	// model) stay on the deployment of their model that served the key
	// last, so its prompt cache serves them (config
	// admission.cache_affinity). Ingest fills it, when the producer did
	// not, from the request's prompt_cache_key or user, the
	// X-Sluice-Affinity header, or the conversation a Responses follow-up
	// (previous_response_id) continues. At most MaxAffinity bytes.
	Affinity string `json:"affinity,omitempty"`

	// Provider, set by a producer, pins one deployment of its model: the
	// job then waits for that one. Everything else Sluice adds to a job as
	// it moves travels in internal/task.Task, which embeds this envelope.
	Provider string `json:"provider,omitempty"`
}

// MaxAffinity bounds Job.Affinity.
const MaxAffinity = 256

// Estimate is the cost ingest computed for a job: its tokens and, for a
// model that limits other units, its amount of each (every unit the model
// limits, from the job's Cost or DefaultUnitCost). The seal covers all of
// it.
type Estimate struct {
	PromptTokens int            `json:"prompt_tokens"`
	MaxTokens    int            `json:"max_tokens"`
	Units        map[string]int `json:"units,omitempty"`
	// Class is the request's shape (package tokens: size, script, tools,
	// images): providers' counts differ from the estimate by shape, and
	// the correction is learned per class.
	Class string `json:"class,omitempty"`
}

// MaxUnits is how many units a job's cost may name (and a model may limit)
// besides requests and tokens.
const MaxUnits = 4

// MaxUnitCost bounds one unit's amount in a job's cost.
const MaxUnitCost = 1 << 30

// DefaultUnitCost is what a job costs of a unit its model limits when its
// Cost does not name the unit: one, as every call costs one request.
const DefaultUnitCost = 1

// ValidUnitName reports whether s may name a unit: 1-32 of a-z, 0-9 and
// '_', and neither "requests" nor "tokens" (those are always counted).
func ValidUnitName(s string) bool {
	if len(s) == 0 || len(s) > 32 || s == "requests" || s == "tokens" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// UnitNames returns the names in units, sorted.
func UnitNames(units map[string]int) []string {
	names := make([]string, 0, len(units))
	for name := range units {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// CheckUnits checks a map of unit amounts (a job's cost, an estimate's or
// a reservation's units): at most MaxUnits valid names, amounts in [0,
// MaxUnitCost]. field names it in the error ("cost").
func CheckUnits(field string, units map[string]int) error {
	if len(units) > MaxUnits {
		return invalid(field, "names %d units; at most %d", len(units), MaxUnits)
	}
	for _, name := range UnitNames(units) {
		n := units[name]
		if !ValidUnitName(name) {
			return invalid(field, "unit %q: a unit is named by 1-32 of a-z, 0-9 and '_' (not requests or tokens)", clip.String(name, 64))
		}
		if n < 0 || n > MaxUnitCost {
			return invalid(field+"."+name, "must be between 0 and %d, got %d", MaxUnitCost, n)
		}
	}
	return nil
}

// Cost is what a provider charges against TPM at arrival: prompt plus max output.
func (e Estimate) Cost() int { return e.PromptTokens + e.MaxTokens }

// Attempt records one provider call.
type Attempt struct {
	N          int       `json:"n"`
	Provider   string    `json:"provider"`
	Model      string    `json:"model"`
	StartedAt  time.Time `json:"started_at"`
	DurationMS int64     `json:"duration_ms"`
	Status     int       `json:"status,omitempty"`
	Outcome    string    `json:"outcome"`
	Error      *Error    `json:"error,omitempty"`
}

// WaitHint is ingest's answer on sluice.ingest.wait.<tenant>: how long a
// producer whose job INTAKE refused should wait before offering it again,
// estimated from the jobs ahead (INTAKE and QUEUE) at the model's rate.
type WaitHint struct {
	RetryAfterMS int64 `json:"retry_after_ms"`
}

// Usage is what the provider reported.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CachedTokens     int `json:"cached_tokens,omitempty"`
	// ReasoningTokens are output tokens a reasoning model spent thinking:
	// part of CompletionTokens, as OpenAI counts and charges them.
	ReasoningTokens int `json:"reasoning_tokens,omitempty"`
	// CacheWriteTokens are prompt tokens written to the provider's cache
	// (Anthropic's cache_creation_input_tokens; part of PromptTokens).
	CacheWriteTokens int `json:"cache_write_tokens,omitempty"`
}

// Error is a machine-readable failure.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// RetryAfterMS, when set, hints how long a producer should wait.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Error codes Sluice itself produces.
const (
	CodeInvalidRequest = "invalid_request"
	CodeUnknownTenant  = "unknown_tenant"
	CodeUnknownModel   = "unknown_model"
	CodeTooLarge       = "request_too_large"
	CodeUnsupported    = "unsupported"
	CodeQueueFull      = "queue_full"
	// CodeSpendBudget: the tenant's spend budget (config tenants[].spend)
	// cannot hold the job's worst-case cost, and the tenant's on_exceed
	// is refuse (or the model has no price to bound the cost by).
	CodeSpendBudget     = "spend_budget_exceeded"
	CodeDeadlineExpired = "deadline_expired"
	CodeProviderError   = "provider_error"
	// CodeDeploymentAuth: the provider refused the operator's key for the
	// deployment (401, 403): the operator's problem, not the caller's.
	CodeDeploymentAuth = "deployment_auth_failed"
	// CodeDeploymentUnreachable: the deployment's endpoint could not be
	// reached (connection refused, DNS, TLS, connect timeout).
	CodeDeploymentUnreachable = "deployment_unreachable"
	CodeRetriesExceeded       = "retries_exhausted"
	// CodeResponseTooLarge: the provider answered (and billed) more than
	// limits.max_response_bytes; the answer is not stored and the call is
	// never repeated.
	CodeResponseTooLarge = "response_too_large"
	// CodeStreamInterrupted: a streamed answer broke after its first token.
	CodeStreamInterrupted = "stream_interrupted"
	// CodeCancelled: the caller cancelled the job.
	CodeCancelled = "cancelled"
	// CodeRequeueLimit: the job went back to admission too many times in
	// a row for one reason without a provider call (Sluice's fault, or a
	// deployment that stays unusable); it is dead-lettered for the
	// operator to look at and replay.
	CodeRequeueLimit = "requeue_limit"
)

// Result is the one terminal outcome of a job, published on
// sluice.result.<tenant>.<job_id>.
type Result struct {
	JobID       string          `json:"job_id"`
	Tenant      string          `json:"tenant"`
	Status      Status          `json:"status"`
	Response    json.RawMessage `json:"response,omitempty"`
	Error       *Error          `json:"error,omitempty"`
	Usage       *Usage          `json:"usage,omitempty"`
	Attempts    int             `json:"attempts"`
	Provider    string          `json:"provider,omitempty"`
	Model       string          `json:"model,omitempty"`
	SubmittedAt time.Time       `json:"submitted_at,omitzero"`
	CompletedAt time.Time       `json:"completed_at"`
	// DuplicateOf is set when this job joined an earlier one with the same
	// idempotency key and shares its outcome.
	DuplicateOf string `json:"duplicate_of,omitempty"`
	// ProviderRequestID is the provider's id for the last call (its
	// x-request-id or request-id header), for support requests.
	ProviderRequestID string `json:"provider_request_id,omitempty"`
	// TraceID is the W3C trace id of the job's trace, when tracing is on.
	TraceID string `json:"trace_id,omitempty"`
	// Cost is what the call cost by Usage and the model's price, in the
	// configuration's currency. Absent when there is no usage, or when
	// the model has no price: then CostUnpriced is true. Never a zero
	// standing in for "unknown".
	Cost         *float64 `json:"cost,omitempty"`
	CostUnpriced bool     `json:"cost_unpriced,omitempty"`
	// UsageSource says where Usage came from: UsageProvider (the
	// provider reported it) or UsageEstimate (Sluice estimated it).
	UsageSource string `json:"usage_source,omitempty"`
	// Lane is how the call was made: "" (LaneSync) for a synchronous
	// call, LaneBatch for a line of a provider's batch, priced at the
	// model's batch factor.
	Lane string `json:"lane,omitempty"`
	// BatchID is the provider's batch id when Lane is LaneBatch.
	BatchID string `json:"batch_id,omitempty"`
}

// Lanes a call is made in (Result.Lane).
const (
	LaneSync  = ""
	LaneBatch = "batch"
)

// Where a result's usage came from (Result.UsageSource).
const (
	UsageProvider = "provider"
	UsageEstimate = "estimate"
)

// NewID returns a fresh job id (UUIDv7: time-ordered).
func NewID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// Limits bound what ingest accepts.
type Limits struct {
	MaxBodyBytes int // whole envelope
	MaxTokens    int // largest max_tokens accepted
}

// DefaultLimits are used when none are configured.
var DefaultLimits = Limits{MaxBodyBytes: 1 << 20, MaxTokens: 128_000}

// ChatRequest is the part of an OpenAI chat-completions body Sluice reads.
// The full body is forwarded to the provider untouched.
type ChatRequest struct {
	Model               string          `json:"model"`
	Messages            []ChatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int            `json:"max_completion_tokens,omitempty"`
	Stream              bool            `json:"stream,omitempty"`
	StreamOptions       *StreamOptions  `json:"stream_options,omitempty"`
	N                   *int            `json:"n,omitempty"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	// Native is what a Responses job carries for a provider serving the
	// Responses API itself (internal/wire's NativeMember), counted in the
	// estimate. Only Sluice's /v1/responses handler sets it: a producer's
	// body naming it is refused (CheckProducerRequest).
	Native json.RawMessage `json:"sluice_responses,omitempty"`
}

// StreamOptions are a streamed request's options.
type StreamOptions struct {
	// IncludeUsage asks for a last chunk with the usage and no choices.
	IncludeUsage bool `json:"include_usage"`
}

// WantsUsage reports whether a streamed request asked for the usage chunk.
func (r ChatRequest) WantsUsage() bool { return r.StreamOptions != nil && r.StreamOptions.IncludeUsage }

// ChatMessage is one message; content may be a string or an array of parts.
type ChatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name,omitempty"`
}

// Text returns the message's text content (string content, or the text parts).
func (m ChatMessage) Text() string {
	if len(m.Content) == 0 || string(m.Content) == "null" {
		return ""
	}
	var s string
	if decodeFast(m.Content, &s) {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if decodeFast(m.Content, &parts) {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return string(m.Content)
}

// OutputLimit returns the max output tokens the request asks for, or def when
// it names none.
func (r ChatRequest) OutputLimit(def int) int {
	if r.MaxCompletionTokens != nil {
		return *r.MaxCompletionTokens
	}
	if r.MaxTokens != nil {
		return *r.MaxTokens
	}
	return def
}

// Choices is how many completions the request asks for (n; 1 when absent).
func (r ChatRequest) Choices() int {
	if r.N != nil && *r.N > 1 {
		return *r.N
	}
	return 1
}

// ReservedOutput is the output tokens a provider charges at arrival: n
// completions of up to OutputLimit(def) tokens each.
func (r ChatRequest) ReservedOutput(def int) int { return r.OutputLimit(def) * r.Choices() }

// MaxChoices is the largest n accepted (OpenAI's own bound).
const MaxChoices = 128

// ValidationError is a problem with a job that no retry can fix.
type ValidationError struct {
	Code    string
	Field   string
	Message string
}

func (e *ValidationError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s", e.Field, e.Message)
	}
	return e.Message
}

// AsError converts the validation error into a result error.
func (e *ValidationError) AsError() *Error {
	return &Error{Code: e.Code, Message: e.Error()}
}

func invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Code: CodeInvalidRequest, Field: field, Message: fmt.Sprintf(format, args...)}
}

// Decode parses and checks a job envelope. It checks only what needs no
// configuration: shape, id, priority, request body. Tenant and model are
// checked against the configuration by ingest.
func Decode(data []byte, lim Limits) (*Job, error) {
	j, err := Parse(data, lim)
	if err != nil {
		return nil, err
	}
	if err := j.Check(lim); err != nil {
		return j, err
	}
	return j, nil
}

// Parse is Decode without Check: the envelope's shape (its size, known
// fields only, each named once, nothing after it, no member of the
// request that only Sluice sets), for a caller that checks the job
// itself. It reads what a producer sent, never a job Sluice built.
func Parse(data []byte, lim Limits) (*Job, error) {
	if lim.MaxBodyBytes > 0 && len(data) > lim.MaxBodyBytes {
		return nil, &ValidationError{Code: CodeTooLarge, Message: fmt.Sprintf("job is %d bytes; the limit is %d", len(data), lim.MaxBodyBytes)}
	}
	if err := CheckMembers("", data, (*Job)(nil)); err != nil {
		// The id only, for the refusal's result to name.
		var named struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(data, &named)
		return &Job{ID: named.ID}, err
	}
	var in envelope
	if !decodeFast(data, &in, jsonv2.RejectUnknownMembers(true)) {
		in = envelope{}
		if err := decodeEnvelope(data, &in); err != nil {
			return nil, err
		}
	}
	j := in.Job
	// The envelope decoded: its request is valid JSON.
	if err := checkProducerMembers("request", j.Request); err != nil {
		return &j, err
	}
	return &j, nil
}

// envelope is what Parse decodes: the job and what it drops.
type envelope struct {
	Job
	dropped
}

// decodeEnvelope decodes a job envelope as encoding/json does, unknown
// fields and data after it refused, in the words of Parse's refusals.
func decodeEnvelope(data []byte, in *envelope) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(in); err != nil {
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			name, _ := strconv.Unquote(f)
			return invalid(clip.String(name, 64), "is not a field of the job envelope (its fields: %s)", strings.Join(EnvelopeFields, ", "))
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			// The path goes through the embedded envelope: "Job.tenant".
			te.Field = strings.TrimPrefix(strings.TrimPrefix(te.Field, "Job."), "dropped.")
		}
		return DecodeError("", "job JSON", err)
	}
	if dec.More() {
		return invalid("", "malformed job JSON: data after the envelope")
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalid("", "malformed job JSON: data after the envelope")
	}
	return nil
}

// decodeFast decodes data into v as json.Unmarshal does (opts added to
// its options), by the v1 API of go-json-experiment/json: the same values
// in about half the time, the text scanned once (FuzzDecodeFast). It
// reports whether it decoded; when it did not, the caller decodes again
// with encoding/json, whose errors its refusals are worded from.
func decodeFast(data []byte, v any, opts ...jsonv2.Options) bool {
	return jsonv2.Unmarshal(data, v, append([]jsonv2.Options{jsonv1.DefaultOptionsV1()}, opts...)...) == nil
}

// SluiceMembers are the members Sluice adds to a job as it moves through
// the mesh (internal/task). An envelope may carry them (a job read from a
// subject and published again); they are read and dropped, never believed.
var SluiceMembers = []string{"submitted_at", "model", "estimate", "not_before", "attempts", "reservation",
	"rate_limited", "seal", "revs", "gated", "cache_target", "pinned", "requeued", "spend_hold", "wait_reason"}

// dropped decodes SluiceMembers into nothing kept.
type dropped struct {
	SubmittedAt json.RawMessage `json:"submitted_at"`
	Model       json.RawMessage `json:"model"`
	Estimate    json.RawMessage `json:"estimate"`
	NotBefore   json.RawMessage `json:"not_before"`
	Attempts    json.RawMessage `json:"attempts"`
	Reservation json.RawMessage `json:"reservation"`
	RateLimited json.RawMessage `json:"rate_limited"`
	Seal        json.RawMessage `json:"seal"`
	Revs        json.RawMessage `json:"revs"`
	Gated       json.RawMessage `json:"gated"`
	CacheTarget json.RawMessage `json:"cache_target"`
	Pinned      json.RawMessage `json:"pinned"`
	Requeued    json.RawMessage `json:"requeued"`
	SpendHold   json.RawMessage `json:"spend_hold"`
	WaitReason  json.RawMessage `json:"wait_reason"`
}

// EnvelopeFields are the fields a producer may set in a job envelope.
var EnvelopeFields = []string{"id", "tenant", "priority", "idempotency_key", "deadline", "task", "endpoint", "request", "cost"}

// CanonicalID reports whether s is a UUID in its canonical form
// (8-4-4-4-12 lower-case hex): the only form that is also a valid KV key
// and NATS subject token. uuid.Parse alone also takes "{...}",
// "urn:uuid:..." and upper case.
func CanonicalID(s string) bool {
	u, err := uuid.Parse(s)
	return err == nil && u.String() == s
}

// Check validates a job already decoded, filling defaults (priority):
// CheckEnvelope, then the request body, parsed against lim.
func (j *Job) Check(lim Limits) error {
	if err := j.CheckEnvelope(); err != nil {
		return err
	}
	if j.Endpoint == EndpointEmbeddings {
		_, err := ParseEmbeddings(j.Request)
		return err
	}
	_, err := ParseRequest(j.Request, lim)
	return err
}

// CheckEnvelope is Check without parsing the request body: that one is
// present, and the endpoint is known. It is for a caller that parses the
// body itself anyway (ingest's token estimate, with the same checks), or
// that holds a seal proving the body was checked (internal/guard).
func (j *Job) CheckEnvelope() error {
	if j.ID != "" && !CanonicalID(j.ID) {
		return invalid("id", "must be a UUID in canonical form (like 0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e, lower case), got %q", clip.String(j.ID, 64))
	}
	if j.Priority == "" {
		j.Priority = Standard
	}
	if !j.Priority.Valid() {
		return invalid("priority", "must be interactive, standard or batch, got %q", clip.String(string(j.Priority), 64))
	}
	if j.Task != "" && !ValidName(j.Task) {
		return invalid("task", "must be 1-64 letters, digits, '-' or '_', got %q", clip.String(j.Task, 64))
	}
	if len(j.IdempotencyKey) > 256 {
		return invalid("idempotency_key", "is %d bytes; at most 256", len(j.IdempotencyKey))
	}
	if err := CheckUnits("cost", j.Cost); err != nil {
		return err
	}
	if len(j.Affinity) > MaxAffinity {
		return invalid("affinity", "is %d bytes; at most %d", len(j.Affinity), MaxAffinity)
	}
	switch j.Endpoint {
	case "", EndpointChat, EndpointResponses:
		if len(j.Request) == 0 || string(j.Request) == "null" {
			return invalid("request", "is required (an OpenAI chat-completions body)")
		}
		return nil
	case EndpointEmbeddings:
		if len(j.Request) == 0 || string(j.Request) == "null" {
			return invalid("request", "is required (an OpenAI embeddings body)")
		}
		return nil
	}
	return invalid("endpoint", "must be %q, %q or %q, got %q", EndpointChat, EndpointEmbeddings, EndpointResponses, clip.String(j.Endpoint, 64))
}

// ParseRequest parses and checks a chat-completions body.
func ParseRequest(body []byte, lim Limits) (*ChatRequest, error) {
	if err := CheckMembers("request", body, (*ChatRequest)(nil)); err != nil {
		return nil, err
	}
	var r ChatRequest
	if !decodeFast(body, &r) {
		r = ChatRequest{}
		if err := json.Unmarshal(body, &r); err != nil {
			return nil, DecodeError("request", "chat-completions body", err)
		}
	}
	if r.Model == "" {
		return nil, invalid("request.model", "is required")
	}
	if len(r.Messages) == 0 {
		return nil, invalid("request.messages", "must hold at least one message")
	}
	for i, m := range r.Messages {
		if m.Role == "" {
			return nil, invalid(fmt.Sprintf("request.messages[%d].role", i), "is required")
		}
	}
	// A slice, not a map: with both fields wrong the error must name the same
	// one every time.
	for _, f := range []struct {
		name string
		v    *int
	}{{"request.max_tokens", r.MaxTokens}, {"request.max_completion_tokens", r.MaxCompletionTokens}} {
		name, v := f.name, f.v
		if v == nil {
			continue
		}
		if *v <= 0 {
			return nil, invalid(name, "must be positive, got %d", *v)
		}
		if lim.MaxTokens > 0 && *v > lim.MaxTokens {
			return nil, invalid(name, "is %d; at most %d", *v, lim.MaxTokens)
		}
	}
	if r.N != nil && (*r.N < 1 || *r.N > MaxChoices) {
		return nil, invalid("request.n", "must be between 1 and %d, got %d", MaxChoices, *r.N)
	}
	if r.StreamOptions != nil && !r.Stream {
		return nil, invalid("request.stream_options", "is only allowed with stream=true")
	}
	if r.Stream && r.Choices() > 1 {
		return nil, &ValidationError{Code: CodeUnsupported, Field: "request.n", Message: "streamed requests support only n=1; send n>1 without stream"}
	}
	return &r, nil
}

// ErrNotFound is returned when a job or result does not exist.
var ErrNotFound = errors.New("not found")
