// Package task is the job as the mesh carries it: the producer's envelope
// (pkg/job.Job, embedded, so its members are the task's on the wire) and
// everything Sluice adds to it as it moves through INTAKE, QUEUE and
// DISPATCH: the estimate and its seal, the reservation, the records'
// revisions, the attempts. A producer's envelope is decoded as a job.Job,
// so none of these can come from a producer; only Sluice's services,
// which share this package, set them.
package task

import (
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Task is a job in the mesh: the envelope and what Sluice knows of it.
type Task struct {
	job.Job

	// Set by Sluice.
	SubmittedAt time.Time     `json:"submitted_at,omitzero"`
	Model       string        `json:"model,omitempty"`
	Estimate    *job.Estimate `json:"estimate,omitempty"`
	NotBefore   *time.Time    `json:"not_before,omitempty"`
	Attempts    []job.Attempt `json:"attempts,omitempty"`
	Reservation *Reservation  `json:"reservation,omitempty"`
	// RateLimited counts the provider's rate-limit refusals of this job:
	// Sluice's misjudgement, which sends it back to admission without
	// spending an attempt.
	RateLimited int `json:"rate_limited,omitempty"`
	// Seal binds the estimate to the request, provider and model (an HMAC
	// with the fleet key, see internal/guard): admission trusts an estimate
	// only under a valid seal and recomputes it otherwise.
	Seal string `json:"seal,omitempty"`
	// Revs are hints ingest leaves for the services that later update the
	// job's records (see Revs).
	Revs *Revs `json:"revs,omitempty"`
	// Gated: admission took this attempt's tenant and per-day budgets when
	// it placed the job. A job sent back unsent (its instant lapsed, the
	// limits were cut) keeps them and passes those gates again free; the
	// executor clears it once the call is made.
	Gated bool `json:"gated,omitempty"`
	// CacheTarget is where the answer is stored (cache.go); ingest sets
	// it on every job it accepts.
	CacheTarget *CacheTarget `json:"cache_target,omitempty"`
	// Pinned: the producer named the deployment (Provider); admission
	// places the job there only, never on another of its model's group.
	Pinned bool `json:"pinned,omitempty"`
	// Requeued counts the times in a row the job went back to admission
	// for one reason without a provider call in between; the executor ends
	// a job that comes back too often for one reason.
	Requeued *Requeued `json:"requeued,omitempty"`
	// SpendHold is the worst-case cost admission reserved from the
	// tenant's spend budget; it stays with the job through retries and
	// is settled when the job ends.
	SpendHold *SpendHold `json:"spend_hold,omitempty"`
	// WaitReason is why admission held the job last before it placed it
	// (a gate or a limit: docs/API.md, "Why is my job waiting?"), for the
	// job's log line. Set by admission only.
	WaitReason string `json:"wait_reason,omitempty"`
	// NoLane: the job left the batch lane (services/lane: a batch
	// cancelled, expired or refused) and runs in the normal lane only.
	NoLane bool `json:"no_lane,omitempty"`
}

// New wraps a producer's envelope: a task with nothing set by Sluice.
func New(j job.Job) *Task { return &Task{Job: j} }

// Reservation is the budget admission reserved for one dispatch, made and
// read by internal/budget only (budget.Rule: Reserve, Held): its parts
// (Slice, Prompt, Cached, Output) and, by its provider's rule, the totals
// on the schedule's dimensions (Requests, Tokens, Output, Units).
type Reservation struct {
	// ID is "<slice>-0": executors from before Slice read the slice here.
	ID       string `json:"id"`
	Requests int    `json:"requests"`
	// Tokens is what the schedule's tokens dimension holds: prompt +
	// output on a provider with one token limit; the input less Cached
	// on one that limits input and output apart (Output is then the
	// output).
	Tokens int `json:"tokens"`
	// Units are the amounts reserved of the model's other units.
	Units map[string]int `json:"units,omitempty"`
	// Output is the output tokens reserved apart from Tokens (a provider
	// that limits them apart: Tokens is then the input), and Cached the
	// prompt tokens expected to be read from the provider's cache and so
	// not reserved (Anthropic does not count them toward its input limit).
	Output int `json:"output,omitempty"`
	Cached int `json:"cached,omitempty"`
	// Slice is the budget slice the reservation was made in (what a
	// settlement charges), and Prompt the prompt tokens placed (the
	// estimate at the fleet's correction, Cached included). Not signed:
	// the guard checks them against the signed ID and Tokens. Zero on a
	// reservation made before they were carried (budget reads those the
	// old way).
	Slice      int64     `json:"slice,omitempty"`
	Prompt     int       `json:"prompt,omitempty"`
	ReservedAt time.Time `json:"reserved_at"`
	// ValidUntil is the latest moment the provider call may start; an executor
	// that picks the job up later sends it back for a new reservation.
	ValidUntil time.Time `json:"valid_until"`
	// SendAt, on a paced model, is the instant the call may leave: the
	// executor waits for it and sends by ValidUntil or not at all.
	SendAt time.Time `json:"send_at,omitzero"`
	// SendFrom, when set, is the earliest the call may leave, before
	// SendAt: admission found room for it from the moment it planned it,
	// so the call need not wait for its instant.
	SendFrom time.Time `json:"send_from,omitzero"`
	// Sig is admission's signature over the reservation and the job's
	// seal (HMAC with the fleet key): an executor sends only what it can
	// verify admission reserved.
	Sig string `json:"sig,omitempty"`
}

// Earliest is the earliest the reserved call may leave: SendFrom when
// set, else SendAt (zero: unpaced, at once).
func (r *Reservation) Earliest() time.Time {
	if !r.SendFrom.IsZero() && r.SendFrom.Before(r.SendAt) {
		return r.SendFrom
	}
	return r.SendAt
}

// Revs are the revisions at which ingest created a job's record (results
// bucket) and its operation record (idempotency bucket). The executor and
// the result service update those records by compare-and-set at these
// revisions without reading them first: a record still at the revision
// ingest created it at is exactly what ingest wrote. A hint that is stale
// (the record changed: a joiner, a cancel, an earlier attempt) or forged
// only fails the compare-and-set, and the service then reads the record as
// it would without a hint. Nothing is trusted from a hint but a revision.
type Revs struct {
	Record uint64 `json:"record,omitempty"`
	Op     uint64 `json:"op,omitempty"`
}

// Requeued is a run of returns to admission for one reason: N of them
// since the job's Calls-th attempt (len(Attempts) then).
type Requeued struct {
	Reason string `json:"reason"`
	N      int    `json:"n"`
	Calls  int    `json:"calls"`
}

// SpendHold is a reservation in a tenant's spend windows: Amount
// billionths of the configured currency, in the UTC day Day (20261203)
// and month Month (202612) it was taken in; a window left empty was not
// capped.
type SpendHold struct {
	Amount int64  `json:"amount"`
	Day    string `json:"day,omitempty"`
	Month  string `json:"month,omitempty"`
}

// CacheTarget is where the executor stores a job's answer once it is
// complete: set by ingest, never taken from a producer.
type CacheTarget struct {
	Key string        `json:"key"`
	TTL time.Duration `json:"ttl"`
}
