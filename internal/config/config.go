// Package config loads and checks Sluice's YAML configuration.
//
// The keys documented in docs/CONFIG.md are a contract: they keep their names
// so users' files and tools keep working. Unknown keys are an error (a typo must
// not silently fall back to a default).
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Config is the whole file.
type Config struct {
	// Server holds what flags and SLUICE_* variables may also set.
	Server    Server            `yaml:"server"`
	Limits    Limits            `yaml:"limits"`
	Admission Admission         `yaml:"admission"`
	Queues    Queues            `yaml:"queues"`
	Providers []Provider        `yaml:"providers"`
	Tenants   []Tenant          `yaml:"tenants"`
	Retry     map[string]Policy `yaml:"retry"`
	Routes    []Route           `yaml:"routes"`
	Streaming Streaming         `yaml:"streaming"`
	Cache     Cache             `yaml:"cache"` // cache.go
	// Currency is what prices and spend budgets are counted in (price.go).
	Currency string `yaml:"currency"`
	// Batches bounds callers' own batches (batches.go).
	Batches Batches `yaml:"batches"`
}

// Streaming configures streamed answers (stream: true).
type Streaming struct {
	// FirstTokenTimeout bounds the wait for a stream's first token; a
	// stream without one by then is retried like any failed call.
	FirstTokenTimeout Duration `yaml:"first_token_timeout"`
	// IdleTimeout bounds the gap between two chunks after the first token;
	// a stream silent longer ends interrupted. (The provider's timeout
	// bounds the whole call.)
	IdleTimeout Duration `yaml:"idle_timeout"`
	// FlushInterval: chunks are published to NATS at most this often,
	// batched (the first token at once).
	FlushInterval Duration `yaml:"flush_interval"`
	// KeepAlive: an SSE comment is sent to HTTP clients after this long
	// without a chunk, so proxies keep a queued stream's connection.
	KeepAlive Duration `yaml:"keepalive"`
	// Replay is how long a job's chunks stay readable (STREAMS max_age).
	Replay Duration `yaml:"replay"`
	// CancelOnDisconnect, by priority: when a streaming HTTP client goes
	// away, stop its provider call and end the job cancelled (default:
	// true for every priority).
	CancelOnDisconnect map[string]bool `yaml:"cancel_on_disconnect"`
}

// Cancels reports whether a job of priority p is cancelled when its
// streaming client disconnects.
func (s Streaming) Cancels(p job.Priority) bool {
	v, ok := s.CancelOnDisconnect[string(p)]
	return !ok || v
}

// Server settings; flags and SLUICE_* variables override them.
type Server struct {
	NATSURL    string `yaml:"nats_url"`
	NATSListen string `yaml:"nats_listen"`
	// NATSCluster is the embedded server's cluster (route) listener,
	// host:port; set, the embedded server joins a JetStream cluster with
	// NATSRoutes (comma-separated nats://host:port URLs of every node's
	// cluster listener, its own may be among them) under NATSName.
	NATSCluster string `yaml:"nats_cluster"`
	NATSRoutes  string `yaml:"nats_routes"`
	NATSName    string `yaml:"nats_name"`
	// NATSClusterAdvertise is the route address the other nodes are told
	// to dial for this one (behind NAT, a proxy or a container name);
	// empty: the cluster listener's.
	NATSClusterAdvertise string `yaml:"nats_cluster_advertise"`
	HTTP                 string `yaml:"http"`
	Data                 string `yaml:"data"`
	Services             string `yaml:"services"`
	LogLevel             string `yaml:"log_level"`
	Replicas             int    `yaml:"replicas"`
	// Open is development mode: the HTTP API serves requests without an
	// API key (the tenant from X-Sluice-Tenant, the only tenant, or
	// DefaultTenant when none is configured). Without it, a process that
	// serves the HTTP API refuses to start with no tenant keys.
	Open bool `yaml:"open"`
	// Metrics is the address of the listener that serves /metrics, apart
	// from the API (`sluice up` defaults it to DefaultMetrics); "" or
	// "off" serves no metrics.
	Metrics string `yaml:"metrics"`
	// Pprof also serves Go's profiler (net/http/pprof, /debug/pprof/) on
	// the metrics listener, for an operator studying a node's CPU or
	// memory. Off by default.
	Pprof bool `yaml:"pprof"`
	// HTTPTLS serves the HTTP API (and a separate metrics listener) over
	// TLS when both files are set.
	HTTPTLS TLSFiles `yaml:"http_tls"`
	// HTTPTimeouts bound the HTTP server's connections.
	HTTPTimeouts HTTPTimeouts `yaml:"http_timeouts"`
	NATS         NATS         `yaml:"nats"`
	// OperatorKeyEnv names the variable holding the bearer key of the
	// operator's HTTP endpoints (POST /admin/reload); empty: none served.
	OperatorKeyEnv string `yaml:"operator_key_env"`
}

// NATS is how a process authenticates to NATS, and how the embedded server
// is secured. Each string also comes from a SLUICE_NATS_* variable (see
// internal/natsauth); secrets themselves never sit in the file, only the
// names of the variables or files holding them.
type NATS struct {
	// Auth turns authentication on the embedded server on or off. Absent:
	// on when tenants are configured. Off with tenants lets anyone who
	// reaches the port read every tenant's jobs.
	Auth *bool `yaml:"auth"`
	// One identity at most: a creds file (JWT + seed), an nkey seed file, a
	// user (password from the variable PasswordEnv names), or a token (from
	// the variable TokenEnv names). None: the identity of the process's
	// services from <data>/secrets/nats-users.json when it exists, else none.
	Creds        string `yaml:"creds"`
	NkeySeedFile string `yaml:"nkey_seed_file"`
	User         string `yaml:"user"`
	PasswordEnv  string `yaml:"password_env"`
	TokenEnv     string `yaml:"token_env"`
	// TLS is the client side: the CA that signed the server's certificate,
	// and a client certificate and key when the server asks for one.
	TLS TLS `yaml:"tls"`
	// ListenTLS serves the embedded server's listener over TLS (cert and
	// key; with ca, clients must present a certificate signed by it).
	ListenTLS TLS `yaml:"listen_tls"`
	// ManageStreams: absent or true, a process creates and updates the
	// streams, consumers' templates and buckets at start; false only
	// checks they exist (for identities not allowed to manage them).
	ManageStreams *bool `yaml:"manage_streams"`
}

// TLS names PEM files.
type TLS struct {
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// TLSFiles name a PEM certificate (chain) and its private key.
type TLSFiles struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// Enabled reports whether TLS is configured.
func (t TLSFiles) Enabled() bool { return t.Cert != "" || t.Key != "" }

// HTTPTimeouts are the HTTP server's timeouts. Write bounds a response
// that does not wait for a result; a chat completion or a long-poll
// extends its own deadlines by the wait it asked for (at most
// limits.max_wait), so Write never cuts a legitimate wait.
type HTTPTimeouts struct {
	ReadHeader Duration `yaml:"read_header"`
	Read       Duration `yaml:"read"`
	Write      Duration `yaml:"write"`
	Idle       Duration `yaml:"idle"`
}

// DefaultTenant is the tenant of keyless requests in open mode when the
// configuration names no tenant.
const DefaultTenant = "default"

// Limits bound what ingest accepts.
type Limits struct {
	MaxBodyBytes     int      `yaml:"max_body_bytes"`
	MaxTokens        int      `yaml:"max_tokens"`
	DefaultMaxTokens int      `yaml:"default_max_tokens"`
	ResultRetention  Duration `yaml:"result_retention"`
	// MaxResponseBytes caps a provider's answer. A larger one is paid for
	// once and ends the job failed with response_too_large; it is never
	// called again. Results are stored in messages of this size plus
	// EnvelopeSlack, which the NATS server's max_payload must allow.
	MaxResponseBytes int `yaml:"max_response_bytes"`
	// DLQRetention is how long dead letters (which hold the job's request)
	// are kept; absent, result_retention.
	DLQRetention Duration `yaml:"dlq_retention"`
	// MaxWait caps how long one HTTP request waits for a result
	// (X-Sluice-Wait-Timeout, GET /v1/jobs/{id}?wait=); longer asks are
	// refused.
	MaxWait Duration `yaml:"max_wait"`
	// MaxWaitersPerTenant caps the HTTP requests of one tenant waiting for
	// results at once, per process; beyond it, 429.
	MaxWaitersPerTenant int `yaml:"max_waiters_per_tenant"`
}

// EnvelopeSlack is the room a message needs around the request or the
// answer it carries (the job or result envelope, attempts, headers).
const EnvelopeSlack = 64 << 10

// DefaultMaxResponseBytes is limits.max_response_bytes when absent.
const DefaultMaxResponseBytes = 4 << 20

// JobMsgBytes is the largest job message (INTAKE, QUEUE, DISPATCH, DLQ):
// the largest accepted body plus its envelope.
func (l Limits) JobMsgBytes() int { return l.MaxBodyBytes + EnvelopeSlack }

// ResultMsgBytes is the largest result message (RESULTS, the results
// bucket): the largest answer plus its envelope.
func (l Limits) ResultMsgBytes() int { return l.MaxResponseBytes + EnvelopeSlack }

// CheckPayload checks that a NATS server whose max_payload is maxPayload
// can carry every message these limits allow.
func (l Limits) CheckPayload(maxPayload int64) error {
	need := max(l.JobMsgBytes(), l.ResultMsgBytes())
	if int64(need) <= maxPayload {
		return nil
	}
	return fmt.Errorf("the NATS server's max_payload is %d bytes, but Sluice needs %d: limits.max_body_bytes (%d) and limits.max_response_bytes (%d) plus %d bytes of envelope; raise max_payload in the NATS server's configuration (the embedded server allows 8 MiB) or lower those limits",
		maxPayload, need, l.MaxBodyBytes, l.MaxResponseBytes, EnvelopeSlack)
}

// Defaults of the HTTP limits and timeouts.
const (
	DefaultMaxWait             = 15 * time.Minute
	DefaultMaxWaitersPerTenant = 100
	DefaultReadHeaderTimeout   = 10 * time.Second
	DefaultReadTimeout         = time.Minute
	DefaultWriteTimeout        = time.Minute
	DefaultIdleTimeout         = 2 * time.Minute
)

// Admission tunes how budgets are taken.
type Admission struct {
	// Slice is the granularity of the shared rate windows.
	Slice Duration `yaml:"slice"`
	// DispatchGrace is how long after its reservation a job may still start
	// its provider call; the window is widened by this much so the provider
	// never sees more than the limit in any 60 s.
	DispatchGrace Duration `yaml:"dispatch_grace"`
	// BurstFraction is the per-second cap as a fraction of the per-minute
	// limit (rounded up): 1/60 by default, the quantization providers
	// document ("60,000 RPM may be enforced as 1,000 requests/second").
	BurstFraction float64 `yaml:"burst_fraction"`
	// SendLead, SendTolerance and PlanHorizon shape send-time pacing: a
	// reservation names the instant its call may leave, a lead from now
	// learned from the dispatch transit executors report and at most
	// SendLead (budget.LeadEstimator), and at most PlanHorizon from now;
	// an executor sends it no later than SendTolerance after that instant
	// (else it is admitted again).
	SendLead      Duration `yaml:"send_lead"`
	SendTolerance Duration `yaml:"send_tolerance"`
	PlanHorizon   Duration `yaml:"plan_horizon"`
	// MaxRateLimited bounds how many times a job goes back to admission
	// because the provider refused it for rate (Sluice's misjudgement,
	// which costs the job none of its attempts); its deadline ends it
	// first in most cases.
	MaxRateLimited int `yaml:"max_rate_limited"`
	Batch          int `yaml:"batch"`
	// MaxHeld and MaxHeldBytes bound the jobs one admission process holds
	// in its fair queues; beyond them the newest jobs of the biggest
	// backlog wait in JetStream instead.
	MaxHeld      int `yaml:"max_held"`
	MaxHeldBytes int `yaml:"max_held_bytes"`
	// TenantWindow bounds how many of one tenant's jobs admission has
	// taken from QUEUE and not finished with, across the fleet: held in
	// fair queues, deferred by redelivery delay, being dispatched. It is
	// the max_ack_pending of the tenant's own QUEUE consumer, so one
	// tenant's waiting work never takes the window another's jobs need.
	TenantWindow int `yaml:"tenant_window"`
	// Quantum is the tokens a tenant of weight 1 earns per scheduling round.
	Quantum int `yaml:"quantum"`
	// Floors are the minimum shares of a model's tokens that standard and
	// batch keep while interactive work waits.
	Floors Floors `yaml:"floors"`
	// Shed refuses new jobs of a class at ingest when QUEUE is this full
	// (a fraction of its message limit): batch first, then standard.
	Shed Shed `yaml:"shed"`
	// CacheAffinity keeps a conversation on one deployment of its model
	// (deployments.go).
	CacheAffinity CacheAffinity `yaml:"cache_affinity"`
	// ScheduleOwner has one process own each model's schedule and write
	// it for the others (internal/budget owner.go). On by default.
	ScheduleOwner ScheduleOwner `yaml:"schedule_owner"`
	// Headroom is the share of a model's window (the minute and the burst
	// second; in the second at least one recent such job) that backlogged
	// work leaves free while jobs that should not wait are about (seen in
	// the last 10 seconds): interactive jobs, and a tenant's job arriving
	// while other tenants' backlogs wait. Those find room at once. Absent:
	// DefaultHeadroom; 0 turns it off. Read it with HeadroomShare.
	Headroom *float64 `yaml:"headroom"`
}

// ScheduleOwner turns on one owner per model's schedule: admission and
// executor processes send their reservations, settlements and give-backs
// to it instead of each writing the KV record.
type ScheduleOwner struct {
	// Enabled: absent, on (read it with On).
	Enabled *bool `yaml:"enabled"`
	// Wait bounds how long a process waits for the owner's answer before
	// it writes the KV itself.
	Wait Duration `yaml:"wait"`
}

// On reports whether schedules have owners: unless enabled is false.
func (s ScheduleOwner) On() bool { return s.Enabled == nil || *s.Enabled }

// Queues bound the two streams jobs wait in. A full stream refuses new jobs
// (producers get "queue full" with a suggested wait); it never drops old
// ones.
type Queues struct {
	// Intake bounds INTAKE, where jobs published over NATS wait for ingest;
	// MaxPerTenant is per tenant (subject sluice.intake.<tenant>).
	Intake StreamBounds `yaml:"intake"`
	// Queue bounds QUEUE, where validated jobs wait for admission;
	// MaxPerTenant is per tenant and priority (subject
	// sluice.queue.<priority>.<tenant>).
	Queue StreamBounds `yaml:"queue"`
}

// StreamBounds are a stream's limits: messages, bytes, and messages per
// subject.
type StreamBounds struct {
	MaxMsgs      int64 `yaml:"max_msgs"`
	MaxBytes     int64 `yaml:"max_bytes"`
	MaxPerTenant int64 `yaml:"max_per_tenant"`
	// MaxBytesPerTenant bounds one tenant's bytes in the stream (0: an
	// equal share of MaxBytes among the configured tenants; see
	// TenantBytes), so one tenant's large jobs cannot fill it for all.
	MaxBytesPerTenant int64 `yaml:"max_bytes_per_tenant"`
}

// Default stream bounds: the values in streams/INTAKE.json and QUEUE.json.
var (
	DefaultIntakeBounds = StreamBounds{MaxMsgs: 200_000, MaxBytes: 256 << 20, MaxPerTenant: 20_000}
	DefaultQueueBounds  = StreamBounds{MaxMsgs: 500_000, MaxBytes: 1 << 30, MaxPerTenant: 100_000}
)

// MinStreamBytes is the smallest max_bytes a bounded stream may have: room
// for one message of the largest size the streams accept (1 MiB).
const MinStreamBytes = 1 << 20

// DefaultBurstFraction is admission.burst_fraction when absent: a second's
// share of the minute.
const DefaultBurstFraction = 1.0 / 60

// DefaultTenantWindow is admission.tenant_window when absent.
const DefaultTenantWindow = 10_000

// DefaultHeadroom is admission.headroom when the key is absent.
const DefaultHeadroom = 0.02

// HeadroomShare is the headroom in effect.
func (a Admission) HeadroomShare() float64 {
	if a.Headroom == nil {
		return DefaultHeadroom
	}
	return *a.Headroom
}

// Floors are per-class minimum shares.
type Floors struct {
	Standard float64 `yaml:"standard"`
	Batch    float64 `yaml:"batch"`
}

// Shed are per-class queue fill levels at which new jobs are refused.
type Shed struct {
	Batch    float64 `yaml:"batch"`
	Standard float64 `yaml:"standard"`
}

// Provider is one upstream API.
type Provider struct {
	Name      string   `yaml:"name"`
	Kind      string   `yaml:"kind"` // openai (default), anthropic or azure
	BaseURL   string   `yaml:"base_url"`
	APIKeyEnv string   `yaml:"api_key_env"`
	Timeout   Duration `yaml:"timeout"`
	Models    []Model  `yaml:"models"`
	// HonoursIdempotencyKey: the provider answers a repeated
	// Idempotency-Key from its own record instead of doing the work again.
	// Only then is a call whose outcome is unknown (its executor lost, its
	// answer cut) sent again; otherwise the job ends outcome_unknown.
	// OpenAI and Anthropic do not document this for their completions
	// endpoints: false by default.
	HonoursIdempotencyKey bool `yaml:"honours_idempotency_key"`
	// Responses: how /v1/responses jobs reach an OpenAI-kind provider,
	// native or chat (responses.go).
	Responses string `yaml:"responses"`
	// APIVersion is an azure provider's api-version (azure.go).
	APIVersion string `yaml:"api_version"`
}

// Model is one model of a provider with its limits: a deployment of the
// model name (deployments.go).
type Model struct {
	Name string `yaml:"name"`
	// Tier orders the deployments of one name: lower tiers are filled
	// first. Weight breaks ties within a tier (higher first). Upstream is
	// the model (or deployment) name sent to the provider when it is not
	// the name callers use.
	Tier           int    `yaml:"tier"`
	Weight         int    `yaml:"weight"`
	Upstream       string `yaml:"upstream"`
	RPM            int    `yaml:"rpm"`
	TPM            int    `yaml:"tpm"`
	MaxConcurrency int    `yaml:"max_concurrency"`
	// ITPM, OTPM and CacheReadsCount: an Anthropic model's input and
	// output token limits (anthropic.go).
	ITPM            int  `yaml:"itpm"`
	OTPM            int  `yaml:"otpm"`
	CacheReadsCount bool `yaml:"cache_reads_count"`
	splits          bool // its provider limits output apart (set with the defaults)
	// warms: its provider asks for load to grow gradually (Anthropic's
	// acceleration limits, Azure's advice), so a model the fleet has
	// never seen ramps up (set with the defaults; WarmsUp).
	warms bool
	// RPD and TPD are the provider's per-day quotas on the model (requests
	// and tokens in a trailing 24 h; 0 = none), as Gemini and some OpenAI
	// tiers state them. A job waits in the queue while the day's quota is
	// spent (or expires at its deadline) instead of drawing a per-day 429,
	// which no retry within minutes can cure; one larger than tpd is
	// refused at ingest.
	RPD int `yaml:"rpd"`
	TPD int `yaml:"tpd"`
	// Units are per-minute limits on units other than requests and tokens
	// (images: 50, audio_seconds: 600, tasks: 100), at most job.MaxUnits,
	// each named by 1-32 of a-z, 0-9 and '_' (0 = counted, no limit). A
	// job states its cost in them (task.Task.Cost, X-Sluice-Cost); a unit it
	// does not name costs job.DefaultUnitCost. Paced, quantized and leased
	// like requests and tokens; not adapted to the provider.
	Units map[string]int `yaml:"units"`
	// Adaptive: absent, Sluice lowers the limits in effect when the
	// provider states lower ones or refuses calls for rate, and recovers
	// toward the configured ones (never above them); 0 stays unlimited.
	// true also discovers a limit configured as 0: it starts low and
	// learns from headers and 429s. false uses the configured limits as
	// they are.
	Adaptive *bool `yaml:"adaptive"`
	// AllowFields lets request body fields through that DefaultDeniedFields
	// holds back, and fields the chat schema does not know (a provider's
	// own: wire.CheckChat); DenyFields refuses more (see FieldDenied).
	AllowFields []string `yaml:"allow_fields"`
	DenyFields  []string `yaml:"deny_fields"`
	// Price is optional, for reports of spend only (price.go).
	Price *Price `yaml:"price"`
	// Batch is the model's batch lane (batch.go).
	Batch *BatchLane `yaml:"batch"`
}

// HasDayQuota reports whether the model has a per-day quota.
func (m Model) HasDayQuota() bool { return m.RPD > 0 || m.TPD > 0 }

// UnitNames returns the model's units in the order budgets index them:
// sorted by name.
func (m Model) UnitNames() []string { return job.UnitNames(m.Units) }

// UnitLimits returns the model's unit limits by index (see UnitNames).
func (m Model) UnitLimits() [budget.MaxUnits]int {
	var out [budget.MaxUnits]int
	for i, name := range m.UnitNames() {
		out[i] = m.Units[name]
	}
	return out
}

// The budgets count as many units as a job may name.
const (
	_ uint = budget.MaxUnits - job.MaxUnits
	_ uint = job.MaxUnits - budget.MaxUnits
)

// Adapts reports whether the model's limits adapt to the provider.
func (m Model) Adapts() bool { return m.Adaptive == nil || *m.Adaptive }

// Discovers reports whether a limit configured as 0 is discovered.
func (m Model) Discovers() bool { return m.Adaptive != nil && *m.Adaptive }

// Tenant is one caller of Sluice.
type Tenant struct {
	Name      string `yaml:"name"`
	APIKeyEnv string `yaml:"api_key_env"`
	// APIKeys are more HTTP keys beside APIKeyEnv, each with an optional
	// expiry and model list (apikeys.go): rotation with overlap.
	APIKeys []APIKey `yaml:"api_keys"`
	Weight  int      `yaml:"weight"`
	// Optional budgets across all of the tenant's models (0 = none):
	// requests and tokens per minute and per day (trailing 24 h).
	RPM int `yaml:"rpm"`
	TPM int `yaml:"tpm"`
	RPD int `yaml:"rpd"`
	TPD int `yaml:"tpd"`
	// MaxConcurrency caps the tenant's calls in flight across the fleet (0 = none).
	MaxConcurrency int `yaml:"max_concurrency"`
	// Spend caps what the tenant's calls cost per UTC day and month
	// (spend.go); nil: no cap.
	Spend *Spend `yaml:"spend"`
}

// Policy is a retry policy class.
type Policy struct {
	MaxAttempts int      `yaml:"max_attempts"`
	MaxElapsed  Duration `yaml:"max_elapsed"`
	BaseDelay   Duration `yaml:"base_delay"`
	MaxDelay    Duration `yaml:"max_delay"`
}

// Duration is a time.Duration written as "1.5s" in YAML.
type Duration time.Duration

func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return &durationError{value: n.Value}
	}
	*d = Duration(v)
	return nil
}

// durationError is a value that is not a duration; Check names its key.
type durationError struct {
	value string
}

func (e *durationError) Error() string {
	return fmt.Sprintf("%q is not a duration (like 500ms, 8s, 5m)", e.value)
}

func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Parse decodes and checks a YAML document, filling defaults. Its error is
// a Problems naming every problem by key path and line (see Check).
func Parse(data []byte) (*Config, error) {
	c, ps := Check(data, nil)
	if len(ps) > 0 {
		return nil, ps
	}
	return c, nil
}

// Load reads a file; an empty path gives the defaults (no providers: only
// useful with the demo, which supplies its own).
func Load(path string) (*Config, error) {
	if path == "" {
		return Parse(nil)
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("config: %w (write one with `sluice init %s`)", err, path)
	}
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// DefaultPolicies are the retry classes every config has unless it overrides them.
var DefaultPolicies = map[string]Policy{
	"interactive": {MaxAttempts: 3, MaxElapsed: Duration(8 * time.Second), BaseDelay: Duration(250 * time.Millisecond), MaxDelay: Duration(2 * time.Second)},
	"standard":    {MaxAttempts: 5, MaxElapsed: Duration(60 * time.Second), BaseDelay: Duration(500 * time.Millisecond), MaxDelay: Duration(10 * time.Second)},
	"batch":       {MaxAttempts: 8, MaxElapsed: Duration(300 * time.Second), BaseDelay: Duration(time.Second), MaxDelay: Duration(60 * time.Second)},
}

// withDefaults fills every setting left out with its default, area by
// area.
func (c *Config) withDefaults() {
	c.limitsDefaults()
	c.httpDefaults()
	c.queuesDefaults()
	c.admissionDefaults() // after queues: the tenant window fits QUEUE
	c.providersDefaults()
	c.tenantsDefaults()
	c.streamingDefaults()
	c.retryDefaults()
	c.Batches.withDefaults()
	c.Cache.withDefaults() // cache.go
	c.spendDefaults()      // spend.go
}

func (c *Config) limitsDefaults() {
	if c.Limits.MaxBodyBytes == 0 {
		c.Limits.MaxBodyBytes = job.DefaultLimits.MaxBodyBytes
	}
	if c.Limits.MaxTokens == 0 {
		c.Limits.MaxTokens = job.DefaultLimits.MaxTokens
	}
	if c.Limits.DefaultMaxTokens == 0 {
		c.Limits.DefaultMaxTokens = 1024
	}
	if c.Limits.ResultRetention == 0 {
		c.Limits.ResultRetention = Duration(24 * time.Hour)
	}
	if c.Limits.MaxResponseBytes == 0 {
		c.Limits.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.Limits.DLQRetention == 0 {
		c.Limits.DLQRetention = c.Limits.ResultRetention
	}
	if c.Limits.MaxWait == 0 {
		c.Limits.MaxWait = Duration(DefaultMaxWait)
	}
	if c.Limits.MaxWaitersPerTenant == 0 {
		c.Limits.MaxWaitersPerTenant = DefaultMaxWaitersPerTenant
	}
}

func (c *Config) httpDefaults() {
	for _, d := range []struct {
		got *Duration
		def time.Duration
	}{{&c.Server.HTTPTimeouts.ReadHeader, DefaultReadHeaderTimeout}, {&c.Server.HTTPTimeouts.Read, DefaultReadTimeout},
		{&c.Server.HTTPTimeouts.Write, DefaultWriteTimeout}, {&c.Server.HTTPTimeouts.Idle, DefaultIdleTimeout}} {
		if *d.got == 0 {
			*d.got = Duration(d.def)
		}
	}
}

func (c *Config) admissionDefaults() {
	if c.Admission.Slice == 0 {
		c.Admission.Slice = Duration(250 * time.Millisecond)
	}
	if c.Admission.DispatchGrace == 0 {
		c.Admission.DispatchGrace = Duration(time.Second)
	}
	if c.Admission.BurstFraction == 0 {
		c.Admission.BurstFraction = DefaultBurstFraction
	}
	if c.Admission.SendLead == 0 {
		c.Admission.SendLead = Duration(20 * time.Millisecond)
	}
	if c.Admission.SendTolerance == 0 {
		c.Admission.SendTolerance = Duration(15 * time.Millisecond)
	}
	if c.Admission.PlanHorizon == 0 {
		c.Admission.PlanHorizon = Duration(2 * time.Second)
	}
	if c.Admission.ScheduleOwner.Wait == 0 {
		c.Admission.ScheduleOwner.Wait = Duration(100 * time.Millisecond)
	}
	if c.Admission.MaxRateLimited == 0 {
		c.Admission.MaxRateLimited = 100
	}
	if c.Admission.Batch == 0 {
		c.Admission.Batch = 256
	}
	if c.Admission.MaxHeld == 0 {
		c.Admission.MaxHeld = 20000
	}
	if c.Admission.MaxHeldBytes == 0 {
		c.Admission.MaxHeldBytes = 256 << 20
	}
	if c.Admission.TenantWindow == 0 {
		c.Admission.TenantWindow = int(min(DefaultTenantWindow, c.Queues.Queue.MaxMsgs))
	}
	if c.Admission.Quantum == 0 {
		c.Admission.Quantum = 2000
	}
	if c.Admission.Floors == (Floors{}) {
		c.Admission.Floors = Floors{Standard: 0.10, Batch: 0.05}
	}
	if c.Admission.Shed == (Shed{}) {
		c.Admission.Shed = Shed{Batch: 0.8, Standard: 0.95}
	}
	c.Admission.CacheAffinity.withDefaults() // deployments.go
}

func (c *Config) queuesDefaults() {
	for _, q := range []struct{ got, def *StreamBounds }{{&c.Queues.Intake, &DefaultIntakeBounds}, {&c.Queues.Queue, &DefaultQueueBounds}} {
		if q.got.MaxMsgs == 0 {
			q.got.MaxMsgs = q.def.MaxMsgs
		}
		if q.got.MaxBytes == 0 {
			q.got.MaxBytes = q.def.MaxBytes
		}
		if q.got.MaxPerTenant == 0 {
			q.got.MaxPerTenant = min(q.def.MaxPerTenant, q.got.MaxMsgs)
		}
	}
}

func (c *Config) providersDefaults() {
	for i := range c.Providers {
		p := &c.Providers[i]
		if p.Kind == "" {
			p.Kind = "openai"
		}
		if p.Timeout == 0 {
			p.Timeout = Duration(120 * time.Second)
		}
		for j := range p.Models {
			if p.Models[j].MaxConcurrency == 0 {
				p.Models[j].MaxConcurrency = 64
			}
			if p.Models[j].Weight == 0 {
				p.Models[j].Weight = 1
			}
			p.Models[j].splits = SplitsOutput(p.Kind)
			p.Models[j].warms = p.Kind == "anthropic" || p.Kind == KindAzure
		}
	}
}

func (c *Config) tenantsDefaults() {
	for i := range c.Tenants {
		if c.Tenants[i].Weight == 0 {
			c.Tenants[i].Weight = 1
		}
	}
}

func (c *Config) streamingDefaults() {
	st := &c.Streaming
	for _, d := range []struct {
		v   *Duration
		def time.Duration
	}{{&st.FirstTokenTimeout, 60 * time.Second}, {&st.IdleTimeout, 30 * time.Second}, {&st.FlushInterval, 25 * time.Millisecond},
		{&st.KeepAlive, 15 * time.Second}, {&st.Replay, 5 * time.Minute}} {
		if *d.v == 0 {
			*d.v = Duration(d.def)
		}
	}
}

func (c *Config) retryDefaults() {
	if c.Retry == nil {
		c.Retry = map[string]Policy{}
	}
	for k, v := range DefaultPolicies {
		if _, ok := c.Retry[k]; !ok {
			c.Retry[k] = v
		}
	}
}

// Validate reports every problem, each naming its key, as a Problems.
func (c *Config) Validate() error {
	if ps := c.problems(); len(ps) > 0 {
		return ps
	}
	return nil
}

// failFunc records a problem with key.
type failFunc func(key, format string, args ...any)

// problems checks every rule and returns what breaks them, in key order.
// Each area has its own check; the order of the list is the order of the
// report.
func (c *Config) problems() Problems {
	var ps Problems
	fail := func(key, format string, args ...any) {
		ps = append(ps, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	for _, check := range []func(*Config, failFunc){
		(*Config).checkLimits,
		(*Config).checkHTTP,
		(*Config).checkDefaultMaxTokens,
		(*Config).checkAdmission,
		(*Config).checkStreaming,
		(*Config).checkQueues,
		(*Config).checkNATS,
		(*Config).checkProviders,
		(*Config).checkGroups,   // deployments.go
		(*Config).checkAffinity, // deployments.go
		(*Config).checkKeyNames, // names.go
		(*Config).checkTenants,
		(*Config).checkRetry,
		(*Config).checkRoutes,
		(*Config).checkBatches,
		(*Config).checkCache,  // cache.go
		(*Config).checkPrices, // price.go
		(*Config).checkSpend,  // spend.go
		(*Config).checkBatch,  // batch.go
	} {
		check(c, fail)
	}
	return ps
}

// checkLimits checks limits.*.
func (c *Config) checkLimits(fail failFunc) {
	if c.Limits.MaxBodyBytes < 1024 {
		fail("limits.max_body_bytes", "must be at least 1024, got %d", c.Limits.MaxBodyBytes)
	}
	if c.Limits.MaxTokens < 1 {
		fail("limits.max_tokens", "must be positive, got %d", c.Limits.MaxTokens)
	}
	if c.Limits.DefaultMaxTokens < 1 {
		fail("limits.default_max_tokens", "must be positive, got %d", c.Limits.DefaultMaxTokens)
	}
	if c.Limits.MaxResponseBytes < 1024 {
		fail("limits.max_response_bytes", "must be at least 1024, got %d", c.Limits.MaxResponseBytes)
	}
	if c.Limits.ResultRetention <= 0 {
		fail("limits.result_retention", "must be positive, got %s", c.Limits.ResultRetention.D())
	}
	if c.Limits.DLQRetention <= 0 {
		fail("limits.dlq_retention", "must be positive, got %s", c.Limits.DLQRetention.D())
	}
	if w := c.Limits.MaxWait.D(); w < time.Second || w > 24*time.Hour {
		fail("limits.max_wait", "must be between 1s and 24h, got %s", w)
	}
	if c.Limits.MaxWaitersPerTenant < 1 {
		fail("limits.max_waiters_per_tenant", "must be positive, got %d", c.Limits.MaxWaitersPerTenant)
	}
}

// checkHTTP checks the HTTP server's timeouts and TLS files.
func (c *Config) checkHTTP(fail failFunc) {
	for _, d := range []struct {
		key string
		v   Duration
	}{{"read_header", c.Server.HTTPTimeouts.ReadHeader}, {"read", c.Server.HTTPTimeouts.Read},
		{"write", c.Server.HTTPTimeouts.Write}, {"idle", c.Server.HTTPTimeouts.Idle}} {
		if d.v < 0 {
			fail("server.http_timeouts."+d.key, "must be positive, got %s", d.v.D())
		}
	}
	if t := c.Server.HTTPTLS; t.Enabled() && (t.Cert == "" || t.Key == "") {
		fail("server.http_tls", "needs both cert and key (PEM files), got cert %q key %q", t.Cert, t.Key)
	}
	if k := c.Server.OperatorKeyEnv; k != "" && !envName(k) {
		fail("server.operator_key_env", "must name an environment variable (the key itself never sits in the file), got %q", clip.String(k, shown))
	}
}

// checkDefaultMaxTokens checks that the default output bound fits the largest.
func (c *Config) checkDefaultMaxTokens(fail failFunc) {
	if c.Limits.DefaultMaxTokens > c.Limits.MaxTokens {
		fail("limits.default_max_tokens", "is %d, above limits.max_tokens %d", c.Limits.DefaultMaxTokens, c.Limits.MaxTokens)
	}
}

// checkAdmission checks admission.*.
func (c *Config) checkAdmission(fail failFunc) {
	if s := c.Admission.Slice.D(); s < 10*time.Millisecond || s > 5*time.Second {
		fail("admission.slice", "must be between 10ms and 5s, got %s", s)
	}
	if g := c.Admission.DispatchGrace.D(); g < 0 || g > 30*time.Second {
		fail("admission.dispatch_grace", "must be between 0 and 30s, got %s", g)
	}
	if c.Admission.MaxHeld < 1 || c.Admission.MaxHeldBytes < 1<<20 {
		fail("admission.max_held", "max_held must be >= 1 and max_held_bytes >= 1 MiB")
	}
	if w := c.Admission.TenantWindow; w < 1 || int64(w) > c.Queues.Queue.MaxMsgs {
		fail("admission.tenant_window", "must be between 1 and queues.queue.max_msgs (%d), got %d", c.Queues.Queue.MaxMsgs, w)
	}
	if h := c.Admission.HeadroomShare(); h < 0 || h >= 0.5 {
		fail("admission.headroom", "must be in [0, 0.5), got %g", h)
	}
	if c.Admission.Quantum < 1 {
		fail("admission.quantum", "must be positive, got %d", c.Admission.Quantum)
	}
	if f := c.Admission.Floors; f.Standard < 0 || f.Batch < 0 || f.Standard+f.Batch > 0.9 {
		fail("admission.floors", "each must be >= 0 and together at most 0.9, got standard %g batch %g", f.Standard, f.Batch)
	}
	if sh := c.Admission.Shed; sh.Batch <= 0 || sh.Batch > 1 || sh.Standard <= 0 || sh.Standard > 1 {
		fail("admission.shed", "levels must be in (0, 1], got batch %g standard %g", sh.Batch, sh.Standard)
	}
	if f := c.Admission.BurstFraction; f <= 0 || f > 1 {
		fail("admission.burst_fraction", "must be in (0, 1], got %g", f)
	}
	if a := c.Admission; a.SendLead < 0 || a.SendTolerance <= 0 || a.SendTolerance > Duration(time.Second) || a.PlanHorizon < a.SendLead || a.PlanHorizon > Duration(time.Minute) {
		fail("admission.send_tolerance", "want send_lead >= 0, 0 < send_tolerance <= 1s and send_lead <= plan_horizon <= 1m; got lead %s, tolerance %s, horizon %s", a.SendLead.D(), a.SendTolerance.D(), a.PlanHorizon.D())
	}
	if w := c.Admission.ScheduleOwner.Wait; w < Duration(time.Millisecond) || w > Duration(5*time.Second) {
		fail("admission.schedule_owner.wait", "must be between 1ms and 5s, got %s", w.D())
	}
	if c.Admission.MaxRateLimited < 1 {
		fail("admission.max_rate_limited", "must be positive, got %d", c.Admission.MaxRateLimited)
	}
	if c.Admission.Batch < 1 {
		fail("admission.batch", "must be positive, got %d", c.Admission.Batch)
	}
}

// checkStreaming checks streaming.*.
func (c *Config) checkStreaming(fail failFunc) {
	st := c.Streaming
	for _, d := range []struct {
		key      string
		v        Duration
		min, max time.Duration
	}{{"first_token_timeout", st.FirstTokenTimeout, time.Millisecond, time.Hour}, {"idle_timeout", st.IdleTimeout, time.Millisecond, time.Hour},
		{"flush_interval", st.FlushInterval, time.Millisecond, time.Second}, {"keepalive", st.KeepAlive, 100 * time.Millisecond, 10 * time.Minute},
		{"replay", st.Replay, 10 * time.Second, 24 * time.Hour}} {
		if d.v.D() < d.min || d.v.D() > d.max {
			fail("streaming."+d.key, "must be between %s and %s, got %s", d.min, d.max, d.v.D())
		}
	}
	for k := range st.CancelOnDisconnect {
		if !job.Priority(k).Valid() {
			fail("streaming.cancel_on_disconnect."+clip.String(k, shown), "is not a priority (interactive, standard, batch)")
		}
	}
}

// checkQueues checks the bounds of INTAKE and QUEUE.
func (c *Config) checkQueues(fail failFunc) {
	for _, q := range []struct {
		key string
		b   StreamBounds
	}{{"queues.intake", c.Queues.Intake}, {"queues.queue", c.Queues.Queue}} {
		if q.b.MaxMsgs < 1 {
			fail(q.key+".max_msgs", "must be positive (a stream without a bound lets memory and disk grow with the offered load), got %d", q.b.MaxMsgs)
		}
		if q.b.MaxBytes < MinStreamBytes {
			fail(q.key+".max_bytes", "must be at least %d (one message of the largest size), got %d", MinStreamBytes, q.b.MaxBytes)
		}
		if q.b.MaxPerTenant < 1 || q.b.MaxPerTenant > q.b.MaxMsgs {
			fail(q.key+".max_per_tenant", "must be between 1 and max_msgs (%d), got %d", q.b.MaxMsgs, q.b.MaxPerTenant)
		}
		if v := q.b.MaxBytesPerTenant; v != 0 && (v < MinStreamBytes || v > q.b.MaxBytes) {
			fail(q.key+".max_bytes_per_tenant", "must be 0 (a share of max_bytes) or between %d and max_bytes (%d), got %d", MinStreamBytes, q.b.MaxBytes, v)
		}
	}
}

// checkNATS checks server.nats.
func (c *Config) checkNATS(fail failFunc) {
	if err := c.Server.NATS.Validate(); err != nil {
		fail("server.nats", "%s", strings.TrimPrefix(err.Error(), "config: server.nats."))
	}
}

// checkProviders checks each provider and its models; within a provider,
// a model name and its subject token belong to one model (the same name
// under several providers is a group of deployments: deployments.go).
func (c *Config) checkProviders(fail failFunc) {
	seenP := map[string]bool{}
	for i, p := range c.Providers {
		key := fmt.Sprintf("providers[%d]", i)
		if !job.ValidName(p.Name) {
			fail(key+".name", "%q must be 1-64 letters, digits, '-' or '_'", p.Name)
		}
		if seenP[p.Name] {
			fail(key+".name", "%q appears twice", p.Name)
		}
		seenP[p.Name] = true
		if p.Kind != "openai" && p.Kind != "anthropic" && p.Kind != KindAzure {
			fail(key+".kind", "must be openai, anthropic or azure, got %q", p.Kind)
		}
		checkAzure(p, key, fail)     // azure.go
		checkResponses(p, key, fail) // responses.go
		u, err := url.Parse(p.BaseURL)
		if p.BaseURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			fail(key+".base_url", "must be an http(s) URL, got %q", p.BaseURL)
		}
		if p.Timeout <= 0 {
			fail(key+".timeout", "must be positive, got %s", p.Timeout.D())
		}
		if p.APIKeyEnv != "" && !envName(p.APIKeyEnv) {
			fail(key+".api_key_env", "must name an environment variable (the key itself never sits in the file), got %q", clip.String(p.APIKeyEnv, shown))
		}
		if len(p.Models) == 0 {
			fail(key+".models", "must list at least one model")
		}
		tokens := map[string]string{} // subject token -> model
		for j, m := range p.Models {
			checkModel(p, m, fmt.Sprintf("%s.models[%d]", key, j), tokens, fail)
		}
	}
}

// checkModel checks one model (at key mk) of provider p. tokens maps the
// subject tokens seen in p to their model.
func checkModel(p Provider, m Model, mk string, tokens map[string]string, fail failFunc) {
	if m.Name == "" {
		fail(mk+".name", "is required")
	}
	tok := job.ModelToken(m.Name)
	if other, ok := tokens[tok]; ok && other == m.Name {
		fail(mk+".name", "%q appears twice under provider %q; list each model once per provider", m.Name, p.Name)
	} else if ok {
		fail(mk+".name", "%q and %q map to the same subject token %q", m.Name, other, tok)
	}
	tokens[tok] = m.Name
	checkDeployment(m, mk, fail) // deployments.go
	if m.RPM < 0 {
		fail(mk+".rpm", "must be >= 0 (0 = no limit), got %d", m.RPM)
	}
	if m.TPM < 0 {
		fail(mk+".tpm", "must be >= 0 (0 = no limit), got %d", m.TPM)
	}
	checkTokenLimits(p.Kind, m, mk, fail) // anthropic.go
	if m.MaxConcurrency < 0 {
		fail(mk+".max_concurrency", "must be > 0, got %d", m.MaxConcurrency)
	}
	if m.RPD < 0 {
		fail(mk+".rpd", "must be >= 0 (0 = no per-day quota), got %d", m.RPD)
	}
	if m.TPD < 0 {
		fail(mk+".tpd", "must be >= 0 (0 = no per-day quota), got %d", m.TPD)
	}
	for _, l := range []struct {
		key   string
		names []string
	}{{".allow_fields", m.AllowFields}, {".deny_fields", m.DenyFields}} {
		for k, f := range l.names {
			if f == "" || len(f) > 64 {
				fail(fmt.Sprintf("%s%s[%d]", mk, l.key, k), "a body field name is 1-64 characters, got %q", clip.String(f, shown))
			}
		}
	}
	if len(m.Units) > job.MaxUnits {
		fail(mk+".units", "names %d units; at most %d", len(m.Units), job.MaxUnits)
	}
	for _, name := range m.UnitNames() {
		if !job.ValidUnitName(name) {
			fail(mk+".units", "%q: a unit is named by 1-32 of a-z, 0-9 and '_' (requests and tokens are rpm and tpm)", clip.String(name, 40))
		}
		if v := m.Units[name]; v < 0 || v > job.MaxUnitCost {
			fail(mk+".units."+name, "must be between 0 (no limit) and %d per minute, got %d", job.MaxUnitCost, v)
		}
	}
}

// checkTenants checks each tenant.
func (c *Config) checkTenants(fail failFunc) {
	seenT := map[string]bool{}
	for i, t := range c.Tenants {
		key := fmt.Sprintf("tenants[%d]", i)
		if !job.ValidName(t.Name) {
			fail(key+".name", "%q must be 1-64 letters, digits, '-' or '_'", t.Name)
		}
		if seenT[t.Name] {
			fail(key+".name", "%q appears twice", t.Name)
		}
		seenT[t.Name] = true
		if t.APIKeyEnv != "" && !envName(t.APIKeyEnv) {
			fail(key+".api_key_env", "must name an environment variable, got %q", clip.String(t.APIKeyEnv, shown))
		}
		c.checkAPIKeys(key, t, fail) // apikeys.go
		for _, l := range []struct {
			k string
			v int
		}{{"rpm", t.RPM}, {"tpm", t.TPM}, {"rpd", t.RPD}, {"tpd", t.TPD}, {"max_concurrency", t.MaxConcurrency}} {
			if l.v < 0 {
				fail(key+"."+l.k, "must be >= 0 (0 = no limit), got %d", l.v)
			}
		}
		if t.Weight < 1 || t.Weight > 1000 {
			fail(key+".weight", "must be between 1 and 1000, got %d", t.Weight)
		}
	}
}

// checkRetry checks the retry policies, in name order.
func (c *Config) checkRetry(fail failFunc) {
	names := make([]string, 0, len(c.Retry))
	for name := range c.Retry {
		names = append(names, name)
	}
	sort.Strings(names) // report the same problem first every time
	for _, name := range names {
		p, key := c.Retry[name], "retry."+name
		if !job.Priority(name).Valid() {
			fail(key, "unknown policy class; use interactive, standard or batch")
			continue
		}
		if p.MaxAttempts < 1 || p.MaxAttempts > 100 {
			fail(key+".max_attempts", "must be between 1 and 100, got %d", p.MaxAttempts)
		}
		if p.MaxElapsed <= 0 {
			fail(key+".max_elapsed", "must be positive")
		}
		if p.BaseDelay <= 0 || p.MaxDelay < p.BaseDelay {
			fail(key+".base_delay", "must be positive and at most max_delay")
		}
	}
}

// checkRoutes checks the routes against the models configured.
func (c *Config) checkRoutes(fail failFunc) {
	hasModel := func(provider, model string) bool {
		_, _, ok := c.Deployment(provider, model)
		return ok
	}
	if err := ValidateRoutes(c.Routes, hasModel); err != nil {
		key, msg, ok := strings.Cut(err.Error(), ": ")
		if !ok {
			key, msg = "routes", err.Error()
		}
		fail(key, "%s", msg)
	}
}

func envName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		ok := r == '_' || (r >= 'A' && r <= 'Z') || (r >= 'a' && r <= 'z') || (i > 0 && r >= '0' && r <= '9')
		if !ok {
			return false
		}
	}
	return true
}

// shown is how many bytes of a bad value an error quotes: a value that
// failed to be an environment variable name may be the secret itself, so
// no more than its first 4 bytes are shown.
const shown = 4

// ModelRef finds a model by the name callers send: its preferred
// deployment (Group's first). What differs between deployments (limits,
// tier, upstream) is read with Deployment (one provider's) or Group (all
// of them).
func (c *Config) ModelRef(model string) (*Provider, *Model, bool) {
	var bp *Provider
	var bm *Model
	for i := range c.Providers {
		p := &c.Providers[i]
		for j := range p.Models {
			m := &p.Models[j]
			if m.Name == model && (bm == nil || m.Tier < bm.Tier || m.Tier == bm.Tier && m.Weight > bm.Weight) {
				bp, bm = p, m
			}
		}
	}
	return bp, bm, bm != nil
}

// Tenant finds a tenant by name.
func (c *Config) Tenant(name string) (*Tenant, bool) {
	for i := range c.Tenants {
		if c.Tenants[i].Name == name {
			return &c.Tenants[i], true
		}
	}
	return nil, false
}

// Policy returns the retry policy for a priority class.
func (c *Config) Policy(p job.Priority) Policy {
	if pol, ok := c.Retry[string(p)]; ok {
		return pol
	}
	return DefaultPolicies[string(job.Standard)]
}

// Validate checks the server.nats section.
func (n NATS) Validate() error {
	fail := func(key, format string, args ...any) error {
		return fmt.Errorf("config: server.nats.%s: %s", key, fmt.Sprintf(format, args...))
	}
	set := 0
	for _, v := range []string{n.Creds, n.NkeySeedFile, n.User, n.TokenEnv} {
		if v != "" {
			set++
		}
	}
	if set > 1 {
		return fail("creds", "give one of creds, nkey_seed_file, user (with password_env) or token_env, not several")
	}
	for _, e := range []struct{ key, v string }{{"password_env", n.PasswordEnv}, {"token_env", n.TokenEnv}} {
		if e.v != "" && !envName(e.v) {
			return fail(e.key, "must name an environment variable (the secret itself never sits in the file), got %q", clip.String(e.v, shown))
		}
	}
	if n.PasswordEnv != "" && n.User == "" {
		return fail("password_env", "needs user")
	}
	if (n.TLS.Cert == "") != (n.TLS.Key == "") {
		return fail("tls", "cert and key go together")
	}
	if (n.ListenTLS.Cert == "") != (n.ListenTLS.Key == "") || (n.ListenTLS.CA != "" && n.ListenTLS.Cert == "") {
		return fail("listen_tls", "needs cert and key (and ca only with them)")
	}
	if err := listenCAClient(n); err != "" {
		return fail("listen_tls", "%s", err)
	}
	return nil
}

// Params are the paced windows of provider models: the same in every
// process (admission plans, executors settle).
func (a Admission) Params() budget.Params {
	return budget.Params{Slice: a.Slice.D(), BurstFraction: a.BurstFraction, Short: time.Second,
		Lead: a.SendLead.D(), Tolerance: a.SendTolerance.D(), Horizon: a.PlanHorizon.D()}
}
