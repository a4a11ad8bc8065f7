// Package mesh holds what several services share: the JetStream handles,
// job records and idempotency records, and the one owner of three
// decisions: how a job ends (Finish publishes every terminal result), how
// it goes back to admission (Requeue, a reason's message-id kind), and how
// a consumed message is settled (Consume runs a Handler whose error is its
// decision, with Recover and the PoisonRule as middleware).
package mesh

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	jsonv1 "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Mesh bundles the JetStream objects a service uses.
type Mesh struct {
	JS          jetstream.JetStream
	Results     jetstream.KeyValue // keys.Record(tenant, job id) -> Record
	Idempotency jetstream.KeyValue // <tenant>.<hash> -> OpRecord
	Budgets     jetstream.KeyValue
	Fleet       jetstream.KeyValue // the fleet key (internal/guard); services only read it
	// Tracing is the node's tracer (nil: off). Requeue and the result
	// publishers carry the trace context of their ctx in the message's
	// headers, and a result the trace id.
	Tracing *tracing.Tracing
	// AckWait and ResendEvery, when set, replace PublishAckWait and
	// ResendEvery for CreateRecords (tests).
	AckWait, ResendEvery time.Duration

	resultsMu sync.Mutex
	results   jetstream.Stream // bound lazily (bound) by StoredResult
	chunks    jetstream.Stream // bound lazily (bound) by StreamEnded
}

// PublishAckWait is how long an asynchronous publish waits for its stream's
// acknowledgement before it counts as failed. A leader election takes a few
// seconds; a publish lost with a leader, or sent into a route that was cut
// without being closed, is never acknowledged at all, and a future waited on
// without a bound would stop its service for good. Connections that publish
// asynchronously set it with jetstream.WithPublishAsyncTimeout.
const PublishAckWait = 5 * time.Second

// ResendEvery is how often a publish that must not stop at the first loss
// (a job's records, a dispatch) is sent again while its acknowledgement is
// awaited: a publish that reached a stream with no leader is dropped, never
// answered, and the copy sent after the election is taken at once. Each
// copy carries what keeps a second one out (a message id, an expected
// sequence).
const ResendEvery = time.Second

// Open binds the buckets (they must exist: streams.Ensure made them).
func Open(ctx context.Context, js jetstream.JetStream) (*Mesh, error) {
	m := &Mesh{JS: js}
	var err error
	if m.Results, err = js.KeyValue(ctx, streams.BucketResults); err != nil {
		return nil, fmt.Errorf("bind bucket %s: %w", streams.BucketResults, err)
	}
	if m.Idempotency, err = js.KeyValue(ctx, streams.BucketIdempotency); err != nil {
		return nil, fmt.Errorf("bind bucket %s: %w", streams.BucketIdempotency, err)
	}
	if m.Budgets, err = js.KeyValue(ctx, streams.BucketBudgets); err != nil {
		return nil, fmt.Errorf("bind bucket %s: %w", streams.BucketBudgets, err)
	}
	if m.Fleet, err = js.KeyValue(ctx, streams.BucketFleet); err != nil {
		return nil, fmt.Errorf("bind bucket %s: %w", streams.BucketFleet, err)
	}
	return m, nil
}

// Record is what the results bucket holds per job.
type Record struct {
	JobID       string      `json:"job_id"`
	Tenant      string      `json:"tenant"`
	Status      job.Status  `json:"status"`
	SubmittedAt time.Time   `json:"submitted_at"`
	Result      *job.Result `json:"result,omitempty"`
	// OpKey is the job's operation record's key (OpKey), for a cancel.
	OpKey string `json:"op_key,omitempty"`
}

// TerminalRecord is the JSON of a job's terminal record for r, whose JSON
// (as a RESULTS message carries it, decoded into r) is raw: the result is
// written as it came, not encoded again. Every reader decodes a record
// (getRecord), with the decoder r came from, so it reads r.
func TerminalRecord(r *job.Result, raw []byte) []byte {
	head, _ := json.Marshal(&Record{JobID: r.JobID, Tenant: r.Tenant, Status: r.Status, SubmittedAt: r.SubmittedAt})
	data := make([]byte, 0, len(head)+len(raw)+len(`,"result":}`))
	data = append(data, head[:len(head)-1]...)
	data = append(data, `,"result":`...)
	data = append(data, raw...)
	return append(data, '}')
}

// ResultHints let the result service update a job's records by
// compare-and-set without reading them first (see task.Revs). They ride on
// the result message as headers; the result service checks them (a stale
// or forged hint fails the compare-and-set or the checks, and it then
// reads the records as without hints).
type ResultHints struct {
	// RecordRev is the revision of the job's record as ingest created it
	// (task.Revs.Record); 0: none.
	RecordRev uint64
	// Op is the operation record as the sender last wrote it, at OpRev;
	// nil: none.
	Op    *OpRecord
	OpRev uint64
	// Facts are the job's facts for the request log and its spend hold;
	// nil: none.
	Facts *JobFacts
}

// JobFacts are what the service ending a job knows of it beyond the
// result: the spend hold the result service settles (its one settlement:
// the result service settles when it first records the result), and the
// request log's fields. No content: User is a hash.
type JobFacts struct {
	Spend       *task.SpendHold `json:"spend,omitempty"`
	Priority    job.Priority    `json:"priority,omitempty"`
	QueueWaitMS int64           `json:"queue_wait_ms,omitempty"`
	TTFTMS      int64           `json:"ttft_ms,omitempty"`
	User        string          `json:"user,omitempty"`
	WaitReason  string          `json:"wait_reason,omitempty"`
}

// FactsOf are j's facts as far as the job itself tells them: its spend
// hold, priority, queue wait (to its first call) and hashed user.
func FactsOf(j *task.Task) *JobFacts {
	f := &JobFacts{Spend: j.SpendHold, Priority: j.Priority, User: userHash(j.Tenant, j.Request), WaitReason: j.WaitReason}
	if len(j.Attempts) > 0 && !j.SubmittedAt.IsZero() {
		f.QueueWaitMS = max(j.Attempts[0].StartedAt.Sub(j.SubmittedAt).Milliseconds(), 0)
	}
	return f
}

// Result hint headers.
const (
	RecRevHeader   = "Sluice-Rec-Rev"
	OpRevHeader    = "Sluice-Op-Rev"
	OpRecordHeader = "Sluice-Op-Record"
	FactsHeader    = "Sluice-Job-Facts"
)

// Hints reads a result message's hints; what does not parse is left out.
func Hints(h nats.Header) ResultHints {
	var out ResultHints
	if v := h.Get(RecRevHeader); v != "" {
		out.RecordRev, _ = strconv.ParseUint(v, 10, 64)
	}
	if v := h.Get(OpRevHeader); v != "" {
		rev, err := strconv.ParseUint(v, 10, 64)
		var op OpRecord
		if err == nil && rev > 0 && jsonv1.Unmarshal([]byte(h.Get(OpRecordHeader)), &op) == nil {
			out.Op, out.OpRev = &op, rev
		}
	}
	if v := h.Get(FactsHeader); v != "" {
		var f JobFacts
		if jsonv1.Unmarshal([]byte(v), &f) == nil {
			out.Facts = &f
		}
	}
	return out
}

// OpKeyHeader carries a result's idempotency record key.
const OpKeyHeader = "Sluice-Op-Key"

// IsPerSubjectLimit reports the stream refusing a second message on a subject.
func IsPerSubjectLimit(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStoreFailed {
		return strings.Contains(apiErr.Description, "maximum messages per subject")
	}
	return err != nil && strings.Contains(err.Error(), "maximum messages per subject exceeded")
}

// IsTooLarge reports a message refused for its size: larger than the
// server's max_payload or the stream's max_msg_size (error 10054).
func IsTooLarge(err error) bool {
	if err == nil {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == 10054 {
		return true
	}
	s := err.Error()
	return errors.Is(err, nats.ErrMaxPayload) || strings.Contains(s, "message size exceeds maximum") || strings.Contains(s, "maximum payload exceeded")
}

// IsStreamFull reports a DiscardNew stream refusing a message for lack of
// room (error code 10077 and its per-subject relatives).
func IsStreamFull(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		if apiErr.ErrorCode == errCodeStoreFailed {
			return true
		}
	}
	if err == nil {
		return false
	}
	s := err.Error()
	return strings.Contains(s, "maximum messages exceeded") || strings.Contains(s, "maximum bytes exceeded") ||
		strings.Contains(s, "maximum messages per subject exceeded") || strings.Contains(s, "insufficient resources")
}

// NotTaken reports a publish no stream took because none could yet: no
// leader to answer (no responders, a 503 "temporarily unavailable"), as
// while a stream elects one; not a stream that is full or a message too
// large. Sent again with its message id or expected sequence, it is
// stored once, as soon as the stream has a leader.
func NotTaken(err error) bool {
	return streams.IsTransient(err) && !IsStreamFull(err) && !IsTooLarge(err)
}

// Lookup returns a tenant's job's record. A record kept under the bare job
// id (keys.LegacyRecord, written before ids were scoped by tenant) is
// returned when it is the tenant's, at revision 0: it is read, never
// written, and expires with the bucket's TTL.
func (m *Mesh) Lookup(ctx context.Context, tenant, jobID string) (*Record, uint64, error) {
	r, rev, err := m.LookupRecord(ctx, tenant, jobID)
	if !errors.Is(err, job.ErrNotFound) || !jobRef(tenant, jobID) {
		return r, rev, err
	}
	r, _, err = m.getRecord(ctx, keys.LegacyRecord(jobID))
	if err == nil && r.Tenant != tenant {
		return nil, 0, job.ErrNotFound
	}
	return r, 0, err
}

// LookupRecord is Lookup without the legacy key: the record a writer
// updates by compare-and-set, at its revision.
func (m *Mesh) LookupRecord(ctx context.Context, tenant, jobID string) (*Record, uint64, error) {
	if !jobRef(tenant, jobID) || tenant == "" {
		return nil, 0, job.ErrNotFound
	}
	return m.getRecord(ctx, keys.Record(tenant, jobID))
}

func (m *Mesh) getRecord(ctx context.Context, key string) (*Record, uint64, error) {
	e, err := m.Results.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, job.ErrNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	var r Record
	if err := jsonv1.Unmarshal(e.Value(), &r); err != nil {
		return nil, 0, fmt.Errorf("record %s: %w", key, err)
	}
	return &r, e.Revision(), nil
}

// enqueue publishes a job to QUEUE. msgID dedupes a repeat within the
// stream's duplicate window (a crash between publish and ack). A refusal
// fails at once (after nats.go's own retries): the caller's message is
// redelivered, which frees its worker while QUEUE elects.
func (m *Mesh) enqueue(ctx context.Context, j *task.Task, msgID string) error {
	data, err := task.Encode(j)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(job.QueueSubject(j.Priority, j.Tenant))
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	tracing.ToNATS(ctx, msg.Header)
	if _, err := m.JS.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("enqueue %s: %w", j.ID, err)
	}
	return nil
}

// Created is the outcome of one record's creation in CreateRecords: its
// revision, or the error jetstream.KeyValue.Create would return
// (jetstream.ErrKeyExists when the key holds a record).
type Created struct {
	Rev uint64
	Err error
}

// CreateRecords creates a tenant's job's record (in results) and its operation
// record (in idempotency) at once: both as asynchronous publishes that
// expect no earlier message on their key, awaited together, which is what
// jetstream.KeyValue.Create sends, without a goroutine or a second round
// trip's wait. One not acknowledged is sent again every ResendEvery until
// the ack wait (a publish that reached a bucket with no leader is dropped,
// never answered; the expected sequence keeps a second copy out). A record
// the fast path does not create (its key holds a record or a delete
// marker, an acknowledgement lost or late) is created again with Create,
// which tells a key that exists from one deleted.
func (m *Mesh) CreateRecords(ctx context.Context, tenant, jobID string, rec []byte, opKey string, op []byte) (job, operation Created) {
	type one struct {
		kv          jetstream.KeyValue
		key         string
		data        []byte
		fut         jetstream.PubAckFuture
		out         Created
		done, retry bool
	}
	if tenant == "" || !jobRef(tenant, jobID) || !validOpKey(opKey) {
		err := fmt.Errorf("records of job %q under %q: not a job id or operation key", clip.String(jobID, 64), clip.String(opKey, 64))
		return Created{Err: err}, Created{Err: err}
	}
	both := [2]*one{{kv: m.Results, key: keys.Record(tenant, jobID), data: rec}, {kv: m.Idempotency, key: opKey, data: op}}
	for _, o := range both {
		msg := &nats.Msg{Subject: "$KV." + o.kv.Bucket() + "." + o.key, Data: o.data, Header: nats.Header{}}
		fut, err := m.JS.PublishMsgAsync(msg, jetstream.WithExpectLastSequencePerSubject(0))
		o.fut, o.retry, o.done = fut, err != nil, err != nil
	}
	ackWait := cmp.Or(m.AckWait, PublishAckWait)
	resend := cmp.Or(m.ResendEvery, ResendEvery)
	deadline := time.Now().Add(ackWait)
	// failed acts on o's refusal: one no stream took (no leader yet, an
	// election) is sent again at the next resend while the wait lasts;
	// any other, and what the wait leaves, Create decides.
	failed := func(o *one, err error) {
		if !NotTaken(err) || !time.Now().Before(deadline) {
			o.retry, o.done = true, true
		}
	}
	// answered acts on o's answer if one came, without waiting.
	answered := func(o *one) bool {
		if !o.done {
			select {
			case ack := <-o.fut.Ok():
				o.out.Rev, o.done = ack.Sequence, true
			case err := <-o.fut.Err():
				failed(o, err)
			default:
			}
		}
		return o.done
	}
	wait := time.NewTimer(min(resend, ackWait))
	defer wait.Stop()
	for _, o := range both {
		for !o.done {
			select {
			case ack := <-o.fut.Ok():
				o.out.Rev, o.done = ack.Sequence, true
			case err := <-o.fut.Err():
				failed(o, err)
			case <-ctx.Done():
				o.out.Err, o.done = ctx.Err(), true
			case <-wait.C:
				left := time.Until(deadline)
				for _, q := range both {
					switch {
					case answered(q):
					case left <= 0:
						q.retry, q.done = true, true
					default:
						if fut, err := m.JS.PublishMsgAsync(q.fut.Msg()); err == nil {
							q.fut = fut
						}
					}
				}
				wait.Reset(min(resend, max(left, 0)))
			}
		}
	}
	for _, o := range both {
		if o.retry {
			o.out.Rev, o.out.Err = o.kv.Create(ctx, o.key, o.data)
		}
	}
	return both[0].out, both[1].out
}

// OpState is the state of one logical operation.
type OpState string

const (
	OpQueued    OpState = "queued"
	OpInFlight  OpState = "in_flight"
	OpCompleted OpState = "completed"
	OpFailed    OpState = "failed"
)

// OpRecord is the idempotency record of one operation.
type OpRecord struct {
	Key       string     `json:"key"` // the idempotency key as given (or derived)
	JobID     string     `json:"job_id"`
	Tenant    string     `json:"tenant"`
	State     OpState    `json:"state"`
	Provider  string     `json:"provider,omitempty"`
	Model     string     `json:"model,omitempty"`
	Attempt   int        `json:"attempt,omitempty"`
	Usage     *job.Usage `json:"usage,omitempty"`
	ResultRef string     `json:"result_ref,omitempty"` // subject of the stored result
	Joiners   []string   `json:"joiners,omitempty"`    // later jobs that share this operation
	// Cancelled: the caller went away (a streaming HTTP client); an
	// executor that has not called the provider yet does not.
	Cancelled bool `json:"cancelled,omitempty"`
	// Sent marks an attempt's call as leaving for the provider: written
	// before the request is sent, cleared when the attempt's outcome is
	// known and the job goes back to the queue. Found by a later delivery,
	// it says the call may have reached the provider and its outcome was
	// never recorded (its executor was lost).
	Sent      *SentMark `json:"sent,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
	// BodyDigest is the request's digest (BodyDigest) when the caller
	// gave the idempotency key.
	BodyDigest string `json:"body_digest,omitempty"`
	// Trace is the W3C traceparent of the accept that made the record
	// (tracing on): a job that joins the operation links its trace to it.
	Trace string `json:"trace,omitempty"`
}

// SentMark is the record of a call leaving for the provider.
type SentMark struct {
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"`
	// By names the execution that wrote it, so it can withdraw its own
	// mark when it did not send.
	By string `json:"by"`
	// Reservation is the reservation the call spent.
	Reservation string `json:"reservation,omitempty"`
}

// OpKey derives the idempotency bucket key for a tenant and idempotency key.
// Without a caller key, the job id is the operation: a redelivery of the
// same job joins it, while two different jobs with equal prompts do not.
func OpKey(tenant, idemKey, jobID string) (bucketKey, key string) {
	key = idemKey
	if key == "" {
		key = "job:" + jobID
	}
	sum := sha256.Sum256([]byte(key))
	return keys.Op(tenant, hex.EncodeToString(sum[:16])), key
}

// ProviderKey is the Idempotency-Key sent to providers for the operation
// whose bucket key is opKey: an opaque digest, stable for the operation
// (so a retry after a crash sends the same key) but naming neither the
// tenant nor the caller's own idempotency key.
func ProviderKey(opKey string) string {
	sum := sha256.Sum256([]byte("sluice-provider-key\x00" + opKey))
	return "sluice-" + hex.EncodeToString(sum[:16])
}

// GetOp reads an operation record.
func (m *Mesh) GetOp(ctx context.Context, bucketKey string) (*OpRecord, uint64, error) {
	if !validOpKey(bucketKey) {
		return nil, 0, job.ErrNotFound
	}
	e, err := m.Idempotency.Get(ctx, bucketKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, job.ErrNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	var r OpRecord
	if err := jsonv1.Unmarshal(e.Value(), &r); err != nil {
		return nil, 0, fmt.Errorf("op record %s: %w", bucketKey, err)
	}
	return &r, e.Revision(), nil
}

// AwaitOp waits until the operation record bucketKey exists (true) or ctx
// ends (false). It is for a reader that found a job's record without its
// operation record: accept writes the two at once but to two streams
// (CreateRecords), so the job's record can be read first.
func (m *Mesh) AwaitOp(ctx context.Context, bucketKey string) bool {
	if !validOpKey(bucketKey) {
		return false
	}
	w, err := m.Idempotency.Watch(ctx, bucketKey)
	if err != nil {
		return false
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return false
		case e, ok := <-w.Updates():
			if !ok {
				return false
			}
			if e != nil && e.Operation() == jetstream.KeyValuePut {
				return true
			}
		}
	}
}

// UpdateOp applies fn to the record by compare-and-set, retrying on
// conflict. fn returns false to leave the record unchanged.
func (m *Mesh) UpdateOp(ctx context.Context, bucketKey string, fn func(r *OpRecord) bool) (*OpRecord, error) {
	r, _, err := m.UpdateOpRev(ctx, bucketKey, fn)
	return r, err
}

// UpdateOpRev is UpdateOp that also returns the record's revision after
// the call.
func (m *Mesh) UpdateOpRev(ctx context.Context, bucketKey string, fn func(r *OpRecord) bool) (*OpRecord, uint64, error) {
	for attempt := 0; attempt < 20; attempt++ {
		r, rev, err := m.GetOp(ctx, bucketKey)
		if err != nil {
			return nil, 0, err
		}
		if !fn(r) {
			return r, rev, nil
		}
		rev, err = m.PutOpAt(ctx, bucketKey, r, rev)
		if err == nil {
			return r, rev, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, 0, fmt.Errorf("update op %s: %w", bucketKey, err)
		}
	}
	return nil, 0, fmt.Errorf("update op %s: too many conflicts", bucketKey)
}

// PutOpAt writes r over the record only if it is still at revision rev
// (compare-and-set) and returns the new revision;
// jetstream.ErrKeyRevisionMismatch when it is not. It is how a service
// that knows a record's revision (task.Revs, ResultHints) updates it
// without reading it first: the record at a revision is the one written
// at it.
func (m *Mesh) PutOpAt(ctx context.Context, bucketKey string, r *OpRecord, rev uint64) (uint64, error) {
	if !validOpKey(bucketKey) {
		return 0, fmt.Errorf("op record %q: not an operation key", clip.String(bucketKey, 64))
	}
	r.UpdatedAt = time.Now().UTC()
	data, err := json.Marshal(r)
	if err != nil {
		return 0, err
	}
	return m.Idempotency.Update(ctx, bucketKey, data, rev)
}

// Wait returns the job's terminal result, waiting until ctx ends, by the
// one protocol (client.WaitResult): it subscribes to the job's result
// subject before looking the record up, so a result written in between is
// not missed.
func (m *Mesh) Wait(ctx context.Context, tenant, jobID string) (*job.Result, error) {
	if !jobRef(tenant, jobID) {
		return nil, job.ErrNotFound
	}
	return client.WaitResult(ctx, m.JS.Conn(), tenant, jobID, func(ctx context.Context) (*job.Result, error) {
		rec, _, err := m.Lookup(ctx, tenant, jobID)
		if err != nil {
			return nil, err
		}
		if rec.Tenant != tenant {
			return nil, job.ErrNotFound
		}
		if rec.Result != nil {
			return rec.Result, nil
		}
		// RESULTS stores a result before republishing it and before the
		// result service records it, so read the stream too: a result
		// published before the subscription is there.
		if r, err := m.StoredResult(ctx, tenant, jobID); err == nil {
			return r, nil
		}
		return nil, nil
	})
}

// errCodeStoreFailed is JetStream's "stream store failed" (10077): a
// DiscardNew stream refusing a message for lack of room.
const errCodeStoreFailed jetstream.ErrorCode = 10077

// bound returns the stream name, bound once into *st (under resultsMu).
func (m *Mesh) bound(ctx context.Context, st *jetstream.Stream, name string) (jetstream.Stream, error) {
	m.resultsMu.Lock()
	defer m.resultsMu.Unlock()
	if *st == nil {
		s, err := m.JS.Stream(ctx, name)
		if err != nil {
			return nil, err
		}
		*st = s
	}
	return *st, nil
}

// StreamEnded reports whether a streamed job's end marker is in STREAMS.
// The executor publishes it just before the job's result, so a caller
// whose stream has ended can ask again before the result is stored.
func (m *Mesh) StreamEnded(ctx context.Context, tenant, jobID string) bool {
	if !jobRef(tenant, jobID) {
		return false
	}
	st, err := m.bound(ctx, &m.chunks, streams.StreamChunks)
	if err != nil {
		return false
	}
	msg, err := st.GetLastMsgForSubject(ctx, job.StreamSubject(tenant, jobID))
	if err != nil {
		return false
	}
	var end struct {
		End job.Status `json:"end"`
	}
	return jsonv1.Unmarshal(msg.Data, &end) == nil && end.End != ""
}

// StoredResult reads a job's result straight from the RESULTS stream.
func (m *Mesh) StoredResult(ctx context.Context, tenant, jobID string) (*job.Result, error) {
	if !jobRef(tenant, jobID) {
		return nil, job.ErrNotFound
	}
	st, err := m.bound(ctx, &m.results, streams.Results)
	if err != nil {
		return nil, err
	}
	msg, err := st.GetLastMsgForSubject(ctx, job.StoreSubject(tenant, jobID))
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, job.ErrNotFound
		}
		return nil, err
	}
	var r job.Result
	if err := jsonv1.Unmarshal(msg.Data, &r); err != nil {
		return nil, fmt.Errorf("result %s: %w", jobID, err)
	}
	return &r, nil
}

// WhySubjectPrefix + <tenant>.<job id> (WhySubject): a fleet-wide request;
// the admission process or executor holding the job answers why it waits
// (Waiting).
const WhySubjectPrefix = "sluice.admission.why."

// WhySubject asks the admission process holding a tenant's job why it waits.
func WhySubject(tenant, jobID string) string { return WhySubjectPrefix + keys.Job(tenant, jobID) }

// PauseDispatch pauses a deployment's DISPATCH consumer until until: the
// effect of a provider's Retry-After beyond health's cooling record, which
// every admission process reads itself (internal/health, Config.Pause).
func (m *Mesh) PauseDispatch(ctx context.Context, provider, model string, until time.Time) error {
	name := keys.DispatchConsumer(provider, job.ModelToken(model))
	if _, err := m.JS.PauseConsumer(ctx, streams.Dispatch, name, until); err != nil {
		return fmt.Errorf("pause consumer %s: %w", name, err)
	}
	return nil
}

// userHash is a short, one-way tag of the caller's user field of request
// (OpenAI's "user", Anthropic's metadata.user_id) for logs: the first 12
// hex digits of SHA-256 over the tenant and the value, so one user reads
// the same in every line and no line holds the id. "" when there is none.
func userHash(tenant string, request json.RawMessage) string {
	var b struct {
		User     string `json:"user"`
		Metadata struct {
			UserID string `json:"user_id"`
		} `json:"metadata"`
	}
	if len(request) == 0 || jsonv1.Unmarshal(task.Members(request, "user", "metadata"), &b) != nil {
		return ""
	}
	u := cmp.Or(b.User, b.Metadata.UserID)
	if u == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(tenant + "\x00" + u))
	return hex.EncodeToString(sum[:6])
}
