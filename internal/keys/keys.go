// Package keys owns every name Sluice derives from a tenant, a job, a
// provider or a model: the keys of the results, idempotency and budgets
// buckets, the JetStream message ids (Nats-Msg-Id) that deduplicate
// publishes, and the DISPATCH and QUEUE consumer names. Subjects are in pkg/job.
//
// The parts are single tokens of known alphabets: tenant and provider names
// and model tokens are 1-64 of [A-Za-z0-9_-] (job.ValidName, job.ModelToken),
// job ids canonical UUIDs, digests hex. None holds '.' or ':', so every
// scheme below starts with a fixed token of its own and joins its parts with
// those separators: two schemes never produce the same name, and one scheme
// produces it from one set of parts only. Where a scheme puts two names side
// by side with a separator they may hold ('-'), or puts a fixed word where a
// name goes, configuration refuses the names that would collide
// (ProviderProblem, DispatchConsumer).
//
// A job id is the producer's (or one Sluice assigned), unique only within its
// tenant: every name that derives from a job has the tenant in it, so two
// tenants may use the same id and each has its own job.
package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Job names one tenant's job: "<tenant>.<job id>". It is the key of the
// job's record in the results bucket, and the key under which a process
// tracks a job it holds or runs.
func Job(tenant, id string) string { return job.KeyOf(tenant, id) }

// Record is the results bucket key of a job's record.
func Record(tenant, id string) string { return Job(tenant, id) }

// LegacyRecord is where a job's record was kept when job ids were global:
// the bare id. Such records are read (never written) until the bucket's TTL
// removes them.
func LegacyRecord(id string) string { return id }

// Response is the results bucket key of what a Responses API call keeps
// for its response id (services/ingest): three tokens, a record's two.
func Response(tenant, id string) string { return "responses." + tenant + "." + id }

// Idempotency bucket.

// Op is the idempotency bucket key of a tenant's operation, digest the hex
// digest of its idempotency key (mesh.OpKey).
func Op(tenant, digest string) string { return tenant + "." + digest }

// RetryPointer is the idempotency bucket key of an SDK retry pointer,
// digest the hex digest of the request's path and body.
func RetryPointer(tenant, digest string) string { return tenant + ".retry." + digest }

// Budgets bucket. The first token says what the key holds.

// Rate is the key of a provider/model's shared rate windows.
func Rate(provider, modelToken string) string { return "rate." + provider + "." + modelToken }

// ScheduleOwner is the key of the record naming the process that owns
// the schedule at rateKey (a Rate key; internal/budget owner.go).
func ScheduleOwner(rateKey string) string { return "owner." + rateKey }

// Conc is the key of a provider/model's concurrency lease.
func Conc(provider, modelToken string) string { return "conc." + provider + "." + modelToken }

// TenantConc is the key of a tenant's concurrency lease. It shares Conc's
// first token, with ReservedProvider in the provider's place.
func TenantConc(tenant string) string { return Conc(ReservedProvider, tenant) }

// Learn is the key of the limits learned for a provider/model.
func Learn(provider, modelToken string) string { return "learn." + provider + "." + modelToken }

// PromptCache is the key of a provider/model's warm prompt prefixes.
func PromptCache(provider, modelToken string) string {
	return "pcache." + provider + "." + modelToken
}

// Calib is the key of a provider/model's estimate calibration ("" class)
// or of one of its request shape classes.
func Calib(provider, modelToken, class string) string {
	k := "calib." + provider + "." + modelToken
	if class != "" {
		k += "." + class
	}
	return k
}

// Health is the key of a deployment's (provider/model's) health record,
// which the whole fleet reads (internal/health).
func Health(provider, modelToken string) string { return "health." + provider + "." + modelToken }

// HealthPrefix starts every Health key: what a watch of them filters on.
const HealthPrefix = "health."

// Affinity is the key of a tenant's cache-affinity record for a model
// group: where each affinity key was last served (services/admission).
func Affinity(tenant, modelToken string) string { return "affinity." + tenant + "." + modelToken }

// TenantMinute and TenantDay are the keys of a tenant's budget windows.
func TenantMinute(tenant string) string { return "tenant." + tenant + ".minute" }
func TenantDay(tenant string) string    { return "tenant." + tenant + ".day" }

// Spend is the key of a tenant's spend window: window is "d" and a UTC
// day (d20261203) or "m" and a UTC month (m202612).
func Spend(tenant, window string) string { return SpendPrefix + tenant + "." + window }

// SpendPrefix begins every spend window's key: the result service, which
// settles spend holds, may write these keys of the budgets bucket only.
const SpendPrefix = "spend."

// ModelDay is the key of a provider/model's per-day quota.
func ModelDay(provider, modelToken string) string {
	return "model." + provider + "." + modelToken + ".day"
}

// LegacyFleetKey is where the fleet key was kept before it had a bucket of
// its own (internal/guard copies it from there once).
const LegacyFleetKey = "fleet.key"

// ReservedProvider can name no provider: TenantConc puts it where Conc has
// a provider's name.
const ReservedProvider = "tenant"

// ProviderProblem says why name cannot be a provider's ("" when it can):
// it must not produce another key's name.
func ProviderProblem(name string) string {
	if name == ReservedProvider {
		return "is reserved (tenants' concurrency keys use it in the budgets bucket)"
	}
	return ""
}

// DispatchConsumer is the name of the executors' DISPATCH consumer of a
// provider/model. Provider names and model tokens may hold '-', so two
// models can produce one name (provider "a-b", model "c" and provider "a",
// model "b-c"); configuration refuses such pairs (config checks every
// model's name here for uniqueness).
func DispatchConsumer(provider, modelToken string) string {
	return "executor-" + provider + "-" + modelToken
}

// AdmissionConsumer is the name of a tenant's QUEUE consumer, which every
// admission process shares: one per tenant, so that each has a window of
// its own. Its fixed first part makes it unique per tenant, and unlike
// the fleet-wide "admission" of older releases.
func AdmissionConsumer(tenant string) string { return "admission-" + tenant }

// Message ids. JetStream drops a publish whose Nats-Msg-Id it saw within
// the stream's duplicate window; each kind of publish has its own first
// token, and every id that derives from a job names its tenant, so one
// tenant's job never makes another's vanish. That holds on the streams
// only services write; on INTAKE, which tenants write with ids of their
// choosing, ids are also ones no other tenant can compute (IntakeMsgID,
// ReplayMsgID).

// Msg is the kind of a publish a message id deduplicates.
type Msg string

const (
	MsgQueued      Msg = "job"         // ingest hands an accepted job to QUEUE
	MsgDispatch    Msg = "dispatch"    // admission hands a reserved job to DISPATCH; seq: its QUEUE delivery
	MsgRetry       Msg = "retry"       // the executor re-queues a failed attempt; seq: the attempt
	MsgRateLimited Msg = "ratelimited" // ... a job the provider throttled; seq: the count
	MsgTenantSlot  Msg = "tenantslot"  // ... a job its tenant's concurrency refused; seq: its DISPATCH delivery
	MsgBreaker     Msg = "breaker"     // ... a job whose model's breaker is open
	MsgDown        Msg = "down"        // ... a job whose deployment is down, to be placed again
	MsgDrain       Msg = "drain"       // ... a job taken while the executor drains
	MsgReadmit     Msg = "readmit"     // ... a job whose reservation lapsed
	MsgUnverified  Msg = "unverified"  // ... a job whose reservation does not verify
	MsgFallback    Msg = "fallback"    // ... a job moved to its fallback model
	MsgLaneSync    Msg = "lanesync"    // ... a job leaving its batch lane for the normal one; seq: its LANE message
	MsgResult      Msg = "result"      // a job's terminal result to RESULTS
	MsgDLQ         Msg = "dlq"         // a dead letter to DLQ
	MsgReplay      Msg = "replay"      // a dead letter replayed to INTAKE; seq: its DLQ sequence
	MsgChunk       Msg = "stream"      // a streamed job's chunks; seq: the batch (read back on resume)
)

// MsgID is the message id of a publish of kind for tenant's job id, with
// seq (a delivery, an attempt) when one job publishes kind more than once.
func MsgID(kind Msg, tenant, id, seq string) string {
	s := string(kind) + ":" + Job(tenant, id)
	if seq != "" {
		s += ":" + seq
	}
	return s
}

// MsgSeq returns the seq of a message id MsgID made ("" when none).
func MsgSeq(msgID string) string {
	i := strings.LastIndexByte(msgID, ':')
	if i < 0 || strings.IndexByte(msgID, ':') == i {
		return ""
	}
	return msgID[i+1:]
}

// IntakeMsgID is the message id of a job published to INTAKE (the public
// form is job.IntakeMsgID, which producers use). INTAKE deduplicates
// stream-wide, and any tenant may set any message id on its own publishes:
// an id another tenant can compute is one it can use first, and the job it
// names is then dropped as a duplicate. So the id is keyed by a secret of
// the publisher's (pkg/client: one per Client): it names the tenant and
// the job, and an HMAC of them and the envelope, so a retry of the same
// publish by the same publisher is dropped, while no other tenant can
// produce it. With an empty secret it is a plain digest, which anyone who
// knows the envelope can compute.
func IntakeMsgID(secret []byte, tenant, id string, envelope []byte) string {
	return job.IntakeMsgID(secret, tenant, id, envelope)
}

// ReplayMsgID is the message id of a dead letter's replay to INTAKE: seq
// is the dead letter's DLQ sequence and entry its stored message, which
// holds a random nonce (internal/dlq) no tenant can read, so a re-run of
// the same replay is dropped and no tenant can forge the id first.
func ReplayMsgID(tenant, id string, seq uint64, entry []byte) string {
	sum := sha256.Sum256(entry)
	return MsgID(MsgReplay, tenant, id, strconv.FormatUint(seq, 10)) + ":" + hex.EncodeToString(sum[:12])
}
