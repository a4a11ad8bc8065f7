package mesh

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Every job ends through Finish: whoever ends it (ingest refusing, joining
// or serving from the cache, admission expiring or failing it, the
// executor, the result service cancelling it or answering the jobs that
// joined it) says how it ended (an Outcome), and Finish makes the result
// from that and the job, the same fields filled whoever ends it, and
// publishes it. Nothing else publishes a terminal result.

// Outcome is how a job ended, as whoever ends it knows it.
type Outcome struct {
	Status   job.Status
	Error    *job.Error
	Response json.RawMessage
	// Usage is what the call used; UsageSource where that came from
	// (job.UsageProvider or job.UsageEstimate; "" is job.UsageProvider).
	Usage       *job.Usage
	UsageSource string
	// Unpaid: Usage is an earlier call's and this answer cost nothing (it
	// was served from the response cache).
	Unpaid            bool
	ProviderRequestID string
	// Provider and Model name the deployment that answered when it is not
	// the job's own (a cache entry's); "" is the job's.
	Provider, Model string
	// Shared is the result of the job whose operation this one joined:
	// this job's outcome is that one's, cost included.
	Shared *job.Result
	// TraceID is the job's trace when the context ending it is not in it
	// (a cancel, read from its operation record); "" is the context's.
	TraceID string
	// Lane and BatchID: the call was a line of the provider's batch
	// BatchID (Lane job.LaneBatch), priced at the model's batch factor.
	Lane, BatchID string
}

// Pricer prices a result from its usage (config.Config does).
type Pricer interface {
	PriceResult(r *job.Result, source string)
}

// Exit says how Finish publishes a job's result.
type Exit struct {
	// OpKey names the job's operation record (OpKey), which the result
	// service settles; "" when the job has none.
	OpKey string
	Hints ResultHints
	// Price prices the result (nil: no price known, the cost is absent).
	Price Pricer
	// Now is the result's completed_at (zero: now).
	Now time.Time
	// Wait, when positive, retries the publish through a leader election
	// of RESULTS for up to that long.
	Wait time.Duration
	// TooLarge, when set, ends a job whose answer RESULTS refuses for its
	// size failed with this error instead (the answer was paid for: it
	// must not be redelivered and paid again).
	TooLarge *job.Error
	// Announce publishes the result on the job's result subject only,
	// without storing it: the refusal of a job Sluice keeps nothing of.
	Announce bool
	// Before, when set, sees the result just before it is published.
	Before func(*job.Result)
}

// Conclude is t's terminal result for o: the outcome's fields, and the
// job's (id, tenant, attempts, provider, model, submission), priced by p
// (nil: none) and completed at now. A shared outcome is the shared
// result, as this job's.
func Conclude(t *task.Task, o Outcome, p Pricer, now time.Time) *job.Result {
	if s := o.Shared; s != nil {
		r := *s
		r.JobID, r.Tenant, r.DuplicateOf = t.ID, t.Tenant, s.JobID
		r.SubmittedAt = cmp.Or(t.SubmittedAt, s.SubmittedAt)
		return &r
	}
	r := &job.Result{JobID: t.ID, Tenant: t.Tenant, Status: o.Status, Response: o.Response, Error: o.Error, Usage: o.Usage,
		Attempts: len(t.Attempts), Provider: cmp.Or(o.Provider, t.Provider), Model: cmp.Or(o.Model, t.Model),
		SubmittedAt: t.SubmittedAt, CompletedAt: now, ProviderRequestID: o.ProviderRequestID, TraceID: o.TraceID,
		Lane: o.Lane, BatchID: o.BatchID}
	switch {
	case o.Unpaid && r.Usage != nil:
		free := 0.0
		r.Cost, r.UsageSource = &free, cmp.Or(o.UsageSource, job.UsageProvider)
	case p != nil:
		p.PriceResult(r, cmp.Or(o.UsageSource, job.UsageProvider))
	case r.Usage != nil:
		r.UsageSource = cmp.Or(o.UsageSource, job.UsageProvider)
	}
	return r
}

// Finish publishes t's one terminal result for o (Conclude), as x says,
// and returns it. A second result for the same job is refused by RESULTS;
// that is not an error here (the first one stands).
func (m *Mesh) Finish(ctx context.Context, t *task.Task, o Outcome, x Exit) (*job.Result, error) {
	now := x.Now
	if now.IsZero() {
		now = time.Now()
	}
	r := Conclude(t, o, x.Price, now.UTC())
	if r.TraceID == "" {
		r.TraceID = tracing.TraceID(ctx)
	}
	if x.Before != nil {
		x.Before(r)
	}
	if x.Announce {
		data, err := json.Marshal(r)
		if err == nil {
			err = m.JS.Conn().Publish(job.ResultSubject(r.Tenant, r.JobID), data)
		}
		return r, err
	}
	publish := func(ctx context.Context) error { return m.publishResult(ctx, r, x.OpKey, x.Hints) }
	var err error
	if x.Wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, x.Wait)
		err = streams.Retry(wctx, publish)
		cancel()
	} else {
		err = publish(ctx)
	}
	if err != nil && x.TooLarge != nil && r.Response != nil && IsTooLarge(err) {
		r.Status, r.Response, r.Error = job.StatusFailed, nil, x.TooLarge
		err = publish(ctx)
	}
	return r, err
}

// publishResult stores r in RESULTS, with hints for the result service.
func (m *Mesh) publishResult(ctx context.Context, r *job.Result, opKey string, h ResultHints) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(job.StoreSubject(r.Tenant, r.JobID))
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, keys.MsgID(keys.MsgResult, r.Tenant, r.JobID, ""))
	if opKey != "" {
		msg.Header.Set(OpKeyHeader, opKey)
		if h.Op != nil && h.OpRev > 0 {
			if op, err := json.Marshal(h.Op); err == nil {
				msg.Header.Set(OpRevHeader, strconv.FormatUint(h.OpRev, 10))
				msg.Header.Set(OpRecordHeader, string(op))
			}
		}
	}
	if h.RecordRev > 0 {
		msg.Header.Set(RecRevHeader, strconv.FormatUint(h.RecordRev, 10))
	}
	tracing.ToNATS(ctx, msg.Header)
	if h.Facts != nil {
		if f, err := json.Marshal(h.Facts); err == nil {
			msg.Header.Set(FactsHeader, string(f))
		}
	}
	_, err = m.JS.PublishMsg(ctx, msg)
	if err != nil && IsPerSubjectLimit(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("publish result %s: %w", r.JobID, err)
	}
	return nil
}
