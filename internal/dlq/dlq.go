// Package dlq reads and writes Sluice's dead letters: the DLQ stream holds one
// Entry per dead-lettered job on sluice.dlq.<tenant>.<job_id>, with the job as
// it last was (attempts included), the reason, and the last error.
//
// # Publishing
//
// Publish writes an entry with the message id "dlq:<tenant>.<job id>", so a repeat
// within the stream's duplicate window is dropped; after the window the DLQ
// keeps one message per subject, so a repeat replaces the entry and a job
// never has two.
//
// Each tenant keeps at most its newest PerTenant entries: after writing one,
// Publish purges the tenant's oldest beyond that (a purge of
// sluice.dlq.<tenant>.> keeping PerTenant). The stream's own limits evict
// the oldest entry of any tenant, so without this bound one tenant's flood
// of dead letters would push out every other tenant's; with it, a tenant's
// flood costs only its own oldest. The bound is the DLQ stream's metadata
// MetaPerTenant (streams/DLQ.json), PerTenant when absent.
//
// # Reading
//
// List and Get read the stream without consuming anything: List scans
// headers only with an ephemeral ordered consumer and then fetches the
// entries it returns by sequence; Get fetches the last message on
// sluice.dlq.<tenant>.<job_id>. Job ids are unique within a tenant only: an
// id given without its tenant must be in one tenant's DLQ.
//
// # Replaying
//
// A dead-lettered job already has its one terminal result, and results are
// write-once, so a replay does not revive the old job: it submits a new one.
// The new job has a new id (UUIDv7), the original's tenant, priority, task
// and request, no deadline (the original's has likely passed and would expire
// the new job at once), and no idempotency key (so it does not join the
// failed operation and receive its failure). It is published to
// sluice.intake.<tenant> with the header Sluice-Replay-Of naming the original
// job and the message id "replay:<tenant>.<original id>:<dlq sequence>:<digest>",
// the digest of the stored entry, which holds a random nonce no tenant can
// read (a tenant may set any message id on its own publishes to INTAKE,
// whose duplicate window is stream-wide: an id it could compute, it could
// use first, and the replay would be dropped). Re-running
// the same replay within INTAKE's duplicate window is dropped by the stream
// (the report then marks the pair Duplicate and cannot know the new id). Once
// INTAKE has the job, the DLQ message is deleted. A job stays in the DLQ if its
// replay could not be published.
package dlq

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// HeaderReplayOf names, on an intake message, the dead-lettered job a replay
// came from.
const HeaderReplayOf = "Sluice-Replay-Of"

// Reasons a job is dead-lettered.
const (
	ReasonRetriesExhausted = "retries_exhausted" // the retry policy's attempts or time ran out
	ReasonMaxDeliveries    = "max_deliveries"    // JetStream gave up redelivering the message
	ReasonOperatorAction   = "operator_action"   // an operator moved the job
	ReasonInvalid          = "invalid"           // the provider rejected the request (400, context length, policy)
	ReasonAuth             = "auth"              // 401, 403, quota or billing: no retry can fix it
	ReasonOutcomeUnknown   = "outcome_unknown"   // the call's outcome is unknown and the policy does not retry it
)

// Entry is one dead-lettered job.
type Entry struct {
	Job       task.Task  `json:"job"` // the job as it last was (attempts included)
	Reason    string     `json:"reason"`
	LastError *job.Error `json:"last_error,omitempty"`
	DeadAt    time.Time  `json:"dead_lettered_at"`
	// Nonce is random, filled by Publish: it makes the message id of the
	// entry's replay one no tenant can compute (keys.ReplayMsgID).
	Nonce string `json:"nonce,omitempty"`
}

// Listed is an entry with its DLQ stream sequence.
type Listed struct {
	Seq uint64 `json:"seq"`
	Entry
}

// Filter selects entries for List.
type Filter struct {
	Tenant string // empty: every tenant
	Limit  int    // keep only the newest Limit entries; 0: all
}

// Pair reports one replayed job.
type Pair struct {
	Tenant   string `json:"tenant,omitempty"`
	Original string `json:"original"`
	New      string `json:"new,omitempty"`
	// Duplicate is set when INTAKE already held this replay (an earlier run
	// published it within the duplicate window); New is then unknown.
	Duplicate bool   `json:"duplicate,omitempty"`
	Error     string `json:"error,omitempty"` // set in ReplayReport.Failed
}

// ReplayReport is what Replay did. A Failed pair with New set was submitted
// but could not be removed from the DLQ.
type ReplayReport struct {
	Replayed []Pair `json:"replayed"`
	Failed   []Pair `json:"failed,omitempty"`
}

// PerTenant is how many dead letters a tenant keeps when the DLQ stream's
// metadata does not say (MetaPerTenant). Entries are at most the stream's
// max_msg_size (the largest job and its envelope, about 1 MiB by default),
// so a tenant holds at most PerTenant of those: the stream's max_bytes
// should be at least tenants × PerTenant × max_msg_size for the stream's
// own discard of the oldest never to be reached first.
const PerTenant = 100

// MetaPerTenant is the DLQ stream's metadata key holding the per-tenant
// bound (a positive integer).
const MetaPerTenant = "sluice_dead_letters_per_tenant"

// Publish writes e to the DLQ, then trims its tenant's entries to the
// newest PerTenant (see the package documentation). It fills e.DeadAt when
// zero.
func Publish(ctx context.Context, js jetstream.JetStream, e *Entry) error {
	if !job.ValidName(e.Job.ID) {
		return fmt.Errorf("dlq: job id %q is not a valid id", e.Job.ID)
	}
	if !job.ValidName(e.Job.Tenant) {
		return fmt.Errorf("dlq: job %s: tenant %q is not a valid name", e.Job.ID, e.Job.Tenant)
	}
	if e.Reason == "" {
		return fmt.Errorf("dlq: job %s: a reason is required", e.Job.ID)
	}
	if e.DeadAt.IsZero() {
		e.DeadAt = time.Now().UTC()
	}
	if e.Nonce == "" {
		e.Nonce = rand.Text()
	}
	data, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("dlq: encode job %s: %w", e.Job.ID, err)
	}
	msg := nats.NewMsg(job.DLQSubject(e.Job.Tenant, e.Job.ID))
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, keys.MsgID(keys.MsgDLQ, e.Job.Tenant, e.Job.ID, ""))
	if _, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(streams.DLQ)); err != nil {
		return fmt.Errorf("dlq: publish job %s: %w", e.Job.ID, err)
	}
	return trim(ctx, js, e.Job.Tenant)
}

// trim purges tenant's oldest dead letters beyond the stream's per-tenant
// bound.
func trim(ctx context.Context, js jetstream.JetStream, tenant string) error {
	s, err := dlqStream(ctx, js)
	if err != nil {
		return err
	}
	keep := uint64(PerTenant)
	if v, ok := s.CachedInfo().Config.Metadata[MetaPerTenant]; ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("dlq: stream %s metadata %s: %q is not a positive integer", streams.DLQ, MetaPerTenant, v)
		}
		keep = n
	}
	err = s.Purge(ctx, jetstream.WithPurgeSubject(job.DLQPrefix+tenant+".*"), jetstream.WithPurgeKeep(keep))
	if err != nil {
		return fmt.Errorf("dlq: keep tenant %s's newest %d: %w", tenant, keep, err)
	}
	return nil
}

// List returns the entries that match f, oldest first (newest last). It
// removes nothing.
func List(ctx context.Context, js jetstream.JetStream, f Filter) ([]Listed, error) {
	filter := job.DLQPrefix + ">"
	if f.Tenant != "" {
		if !job.ValidName(f.Tenant) {
			return nil, fmt.Errorf("dlq: tenant %q is not a valid name", f.Tenant)
		}
		filter = job.DLQPrefix + f.Tenant + ".*"
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("dlq: limit must be 0 (all) or positive, got %d", f.Limit)
	}
	s, err := dlqStream(ctx, js)
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	err = scan(ctx, s, filter, func(seq uint64, _ string) {
		seqs = append(seqs, seq)
		if f.Limit > 0 && len(seqs) > 2*f.Limit {
			seqs = append(seqs[:0], seqs[len(seqs)-f.Limit:]...)
		}
	})
	if err != nil {
		return nil, err
	}
	if f.Limit > 0 && len(seqs) > f.Limit {
		seqs = seqs[len(seqs)-f.Limit:]
	}
	out := make([]Listed, 0, len(seqs))
	for _, seq := range seqs {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // replayed or expired since the scan
		}
		if err != nil {
			return nil, fmt.Errorf("dlq: get message %d: %w", seq, err)
		}
		l, err := decode(m)
		if err != nil {
			return nil, err
		}
		out = append(out, *l)
	}
	return out, nil
}

// Get returns the entry of tenant's job; with tenant "", of the one
// tenant whose DLQ holds jobID (an error when several do). The error
// matches job.ErrNotFound (errors.Is) when the DLQ holds none.
func Get(ctx context.Context, js jetstream.JetStream, tenant, jobID string) (*Listed, error) {
	s, err := dlqStream(ctx, js)
	if err != nil {
		return nil, err
	}
	return get(ctx, s, tenant, jobID)
}

func get(ctx context.Context, s jetstream.Stream, tenant, jobID string) (*Listed, error) {
	m, err := getMsg(ctx, s, tenant, jobID)
	if err != nil {
		return nil, err
	}
	return decode(m)
}

// getMsg is get's stored message.
func getMsg(ctx context.Context, s jetstream.Stream, tenant, jobID string) (*jetstream.RawStreamMsg, error) {
	if !job.ValidName(jobID) {
		return nil, &notFoundError{id: jobID, invalid: true}
	}
	if tenant != "" && !job.ValidName(tenant) {
		return nil, fmt.Errorf("dlq: tenant %q is not a valid name", tenant)
	}
	subject := job.DLQSubject(tenant, jobID)
	if tenant == "" {
		subject = job.DLQPrefix + "*." + jobID
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			return nil, fmt.Errorf("dlq: get job %s: %w", jobID, err)
		}
		if len(info.State.Subjects) > 1 {
			var tenants []string
			for subj := range info.State.Subjects {
				tenants = append(tenants, strings.Split(subj, ".")[2])
			}
			slices.Sort(tenants)
			return nil, fmt.Errorf("dlq: job id %s is dead-lettered for several tenants (%s): name the tenant", jobID, strings.Join(tenants, ", "))
		}
	}
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, &notFoundError{id: jobID, tenant: tenant}
	}
	if err != nil {
		return nil, fmt.Errorf("dlq: get job %s: %w", jobID, err)
	}
	return m, nil
}

// Replay submits a new job for each dead-lettered job in ids (see the
// package documentation), or, with no ids, for every one in the DLQ (only
// tenant's when tenant is set). With ids and a tenant, the ids are the
// tenant's; without a tenant, each id must be in one tenant's DLQ. Every
// id is looked up before anything is replayed: an
// unknown id is an error (matching job.ErrNotFound) and nothing is replayed.
// progress, when not nil, is called after each job. The error is not nil when
// any job was not replayed (it wraps the first failure, or ctx's error when
// ctx ended first); the report's Failed says why for each job tried.
func Replay(ctx context.Context, js jetstream.JetStream, ids []string, tenant string, progress func(done, total int)) (ReplayReport, error) {
	var rep ReplayReport
	if tenant != "" && !job.ValidName(tenant) {
		return rep, fmt.Errorf("dlq: tenant %q is not a valid name", tenant)
	}
	s, err := dlqStream(ctx, js)
	if err != nil {
		return rep, err
	}
	type ref struct{ tenant, id string }
	var refs []ref
	if len(ids) > 0 {
		seen := make(map[string]bool, len(ids))
		for _, id := range ids {
			if seen[id] {
				continue
			}
			seen[id] = true
			l, err := get(ctx, s, tenant, id)
			if err != nil {
				return rep, err
			}
			refs = append(refs, ref{l.Job.Tenant, id})
		}
	} else {
		filter := job.DLQPrefix + ">"
		if tenant != "" {
			filter = job.DLQPrefix + tenant + ".*"
		}
		err := scan(ctx, s, filter, func(_ uint64, subject string) {
			if parts := strings.Split(subject, "."); len(parts) == 4 {
				refs = append(refs, ref{parts[2], parts[3]})
			}
		})
		if err != nil {
			return rep, err
		}
	}

	var first error
	for i, r := range refs {
		if ctx.Err() != nil {
			first = ctx.Err() // the rest are not tried
			break
		}
		p, err := replayOne(ctx, js, s, r.tenant, r.id)
		if err != nil {
			p.Error = err.Error()
			rep.Failed = append(rep.Failed, p)
			if first == nil {
				first = err
			}
		} else {
			rep.Replayed = append(rep.Replayed, p)
		}
		if progress != nil {
			progress(i+1, len(refs))
		}
	}
	if first != nil {
		return rep, fmt.Errorf("%d of %d jobs not replayed (first: %w)", len(refs)-len(rep.Replayed), len(refs), first)
	}
	return rep, nil
}

func replayOne(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, tenant, id string) (Pair, error) {
	p := Pair{Tenant: tenant, Original: id}
	m, err := getMsg(ctx, s, tenant, id) // again: it may have changed since the ids were gathered
	if err != nil {
		return p, err
	}
	l, err := decode(m)
	if err != nil {
		return p, err
	}
	nj := fresh(l.Job)
	if err := job.CheckProducerRequest("request", nj.Request); err != nil {
		// A Responses job for a provider serving that API natively: ingest
		// takes its native member only from the /v1/responses handler, not
		// from INTAKE. The dead letter stays.
		return p, fmt.Errorf("replay %s: not replayable through intake, send the /v1/responses request again (%w)", id, err)
	}
	data, err := json.Marshal(&nj)
	if err != nil {
		return p, fmt.Errorf("replay %s: encode: %w", id, err)
	}
	msg := nats.NewMsg(job.IntakeSubject(nj.Tenant))
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, keys.ReplayMsgID(tenant, id, l.Seq, m.Data))
	msg.Header.Set(HeaderReplayOf, id)
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(streams.Intake))
	if err != nil {
		if mesh.IsStreamFull(err) {
			return p, fmt.Errorf("replay %s: intake is full, retry later: %w", id, err)
		}
		return p, fmt.Errorf("replay %s: submit: %w", id, err)
	}
	if ack.Duplicate {
		p.Duplicate = true
	} else {
		p.New = nj.ID
	}
	if err := s.DeleteMsg(ctx, l.Seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return p, fmt.Errorf("replay %s: submitted, but not removed from the DLQ: %w", id, err)
	}
	return p, nil
}

// notFoundError says the DLQ holds no entry for a job; it matches
// job.ErrNotFound.
type notFoundError struct {
	id, tenant string
	invalid    bool
}

func (e *notFoundError) Error() string {
	if e.invalid {
		return fmt.Sprintf("no dead-lettered job with id %q: not a valid job id", e.id)
	}
	if e.tenant != "" {
		return fmt.Sprintf("no dead-lettered job with id %s of tenant %s", e.id, e.tenant)
	}
	return "no dead-lettered job with id " + e.id
}

func (e *notFoundError) Is(target error) bool { return target == job.ErrNotFound }

// fresh returns the job a replay of old submits: the producer's fields
// (tenant, priority, task, request, cost: the same work costs the same
// units; at_least_once; cache; the conversation's affinity key) without
// the deadline and idempotency key, a new id, and none of the fields
// Sluice fills in (ingest decides the cache target again). A pin to one
// deployment is not kept: the replay may go to any deployment of its
// model, as the one it was pinned to may be why it was dead-lettered.
func fresh(old task.Task) task.Task {
	nj := old
	nj.ID = job.NewID()
	nj.Deadline = nil
	nj.IdempotencyKey = ""
	nj.Provider = ""
	return task.Task{Job: nj.Job}
}

func dlqStream(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, streams.DLQ)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("dlq: no %s stream on this NATS server: has Sluice run against it?", streams.DLQ)
	}
	if err != nil {
		return nil, fmt.Errorf("dlq: stream %s: %w", streams.DLQ, err)
	}
	return s, nil
}

func decode(m *jetstream.RawStreamMsg) (*Listed, error) {
	l := Listed{Seq: m.Sequence}
	if err := json.Unmarshal(m.Data, &l.Entry); err != nil {
		return nil, fmt.Errorf("dlq: message %d on %s: %w", m.Sequence, m.Subject, err)
	}
	return &l, nil
}

// scanIdle bounds the wait for a message the scan expects: messages deleted
// after the scan began are never delivered.
const scanIdle = 5 * time.Second

// scan calls fn with the sequence and subject of every message on filter,
// oldest first, up to the stream's last message when the scan began. It reads
// headers only, through an ephemeral ordered consumer, and removes nothing.
func scan(ctx context.Context, s jetstream.Stream, filter string, fn func(seq uint64, subject string)) error {
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("dlq: stream info: %w", err)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	last := info.State.LastSeq
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{filter},
		HeadersOnly:       true,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("dlq: scan %s: %w", filter, err)
	}
	defer func() {
		// The server would drop it once inactive; do not leave it around.
		if ci := cons.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = s.DeleteConsumer(dctx, ci.Name)
			cancel()
		}
	}()
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return nil
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("dlq: scan %s: %w", filter, err)
	}
	// Stop ends the iterator's goroutines. (Not Closed: for an iterator it
	// closes only when the subscription is already gone when called.)
	defer it.Stop()
	for {
		nctx, cancel := context.WithTimeout(ctx, scanIdle)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return nil // the rest was deleted while we read
			}
			return fmt.Errorf("dlq: scan %s: %w", filter, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("dlq: scan %s: %w", filter, err)
		}
		if md.Sequence.Stream > last {
			return nil
		}
		fn(md.Sequence.Stream, m.Subject())
		if md.NumPending == 0 || md.Sequence.Stream == last {
			return nil
		}
	}
}
