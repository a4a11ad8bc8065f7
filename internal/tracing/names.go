package tracing

import (
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
)

// Every span and attribute name Sluice emits is here, so the names can
// follow the OpenTelemetry semantic conventions as they move: the provider
// call is a GenAI client span (semconv v1.41), the rest are Sluice's own
// (sluice.*). No attribute ever holds a prompt or a completion.

// Span names. The provider call's is "{gen_ai.operation.name} {model}"
// (CallName).
const (
	SpanAccept    = "sluice.accept"    // ingest: validate, estimate, record, enqueue
	SpanWait      = "sluice.wait"      // admission: from QUEUE to a placement, or to a deferral
	SpanPlacement = "sluice.placement" // admission: the reservation and the DISPATCH publish
	SpanResult    = "sluice.result"    // result: the terminal record written
)

// CallName is the provider call span's name, per the GenAI conventions.
func CallName(operation, model string) string { return operation + " " + model }

// GenAI and general attributes (semconv v1.41).
var (
	GenAIOperation       = semconv.GenAIOperationNameKey
	GenAIProvider        = semconv.GenAIProviderNameKey
	GenAIRequestModel    = semconv.GenAIRequestModelKey
	GenAIMaxTokens       = semconv.GenAIRequestMaxTokensKey
	GenAIStream          = semconv.GenAIRequestStreamKey
	GenAIResponseID      = semconv.GenAIResponseIDKey
	GenAIResponseModel   = semconv.GenAIResponseModelKey
	GenAIFinishReasons   = semconv.GenAIResponseFinishReasonsKey
	GenAIInputTokens     = semconv.GenAIUsageInputTokensKey
	GenAIOutputTokens    = semconv.GenAIUsageOutputTokensKey
	GenAICacheReadTokens = semconv.GenAIUsageCacheReadInputTokensKey
	GenAICacheWrite      = semconv.GenAIUsageCacheCreationInputTokensKey
	ServerAddress        = semconv.ServerAddressKey
	ErrorType            = semconv.ErrorTypeKey
)

// GenAI operation names Sluice's endpoints map to.
const (
	OperationChat       = "chat"
	OperationEmbeddings = "embeddings"
)

// ProviderName is gen_ai.provider.name for a provider kind of Sluice's
// configuration.
func ProviderName(kind string) string {
	switch kind {
	case "anthropic":
		return semconv.GenAIProviderNameAnthropic.Value.AsString()
	case "azure":
		return semconv.GenAIProviderNameAzureAIOpenAI.Value.AsString()
	}
	return semconv.GenAIProviderNameOpenAI.Value.AsString()
}

// Sluice's own attributes.
const (
	JobID       = attribute.Key("sluice.job.id")
	Tenant      = attribute.Key("sluice.tenant")
	Priority    = attribute.Key("sluice.priority")
	Via         = attribute.Key("sluice.via")     // http or nats
	Outcome     = attribute.Key("sluice.outcome") // what a hop did with the job
	Attempt     = attribute.Key("sluice.attempt") // the provider call's attempt number (1 for the first)
	Deployment  = attribute.Key("sluice.deployment")
	WaitReason  = attribute.Key("sluice.wait.reason")  // the main reason (the last one seen)
	WaitReasons = attribute.Key("sluice.wait.reasons") // every reason seen, in order
	SendAt      = attribute.Key("sluice.send_at")      // the reservation's planned instant (RFC 3339)
	Delivery    = attribute.Key("sluice.delivery")     // the message's delivery count (set from the second on)
	Status      = attribute.Key("sluice.status")       // the result's status
	ErrorCode   = attribute.Key("sluice.error.code")
	Joined      = attribute.Key("sluice.joined") // the submission joined an earlier job (set only then)
)

// Wait reasons that are not admission's budget reasons (those are rpm,
// tpm, units, burst, tenant_*, model_day_*, paused_provider, budget_store
// and the deployment's health: cooldown, probing...).
const (
	ReasonQueued    = "queued"     // its tenant's fair share: others' turn
	ReasonNotBefore = "not_before" // a retry's backoff or the caller's not_before
)

// TraceIDHeader carries the trace id of every HTTP answer that belongs to
// a trace.
const TraceIDHeader = "X-Sluice-Trace-Id"
