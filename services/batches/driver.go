package batches

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/ingest"
	"github.com/sluice-dev/sluice/services/result"
)

// driver runs one batch while its runner holds it: validating ->
// in_progress (its lines submitted, in file order) -> finalizing (every
// job it submitted ended) -> completed; or, asked to cancel, cancelling
// (its lines not yet submitted never are, its jobs not yet sent are
// cancelled) -> finalizing -> cancelled; or, its window over, expired.
type driver struct {
	*runner
	kv         jetstream.KeyValue
	tenant, id string

	b      *batchRecord // as last written or read
	jobs   []string     // each line's job id
	done   []bool       // each submitted line's job has ended
	tried  []bool       // a cancel was tried for the line's job
	counts struct{ completed, failed int }
}

// errStop ends submission: the batch is cancelling or its window is over.
var errStop = errors.New("submission stopped")

func (d *driver) run(ctx context.Context) error {
	if err := d.load(ctx); err != nil {
		return err
	}
	for ctx.Err() == nil {
		b, err := d.renew(ctx)
		if err != nil {
			return err
		}
		switch {
		case b.Status == StatusFinalizing:
			return d.finalize(ctx)
		case !d.stopping(b) && b.Submitted < b.Total:
			if err := d.submit(ctx); err != nil && !errors.Is(err, errStop) {
				return err
			}
			continue
		}
		if d.poll(ctx) {
			if _, err := d.update(ctx, func(b *batchRecord) {
				b.FinalizingAt = d.now().Unix()
				if b.CancellingAt == 0 { // a cancelled batch says cancelling until it is
					b.Status = StatusFinalizing
				}
			}); err != nil {
				return err
			}
			return d.finalize(ctx)
		}
		select {
		case <-ctx.Done():
		case <-time.After(Tick):
		}
	}
	return nil
}

// load reads the batch and its lines' custom ids (its input was checked
// when it was made).
func (d *driver) load(ctx context.Context) error {
	b, _, err := getBatch(ctx, d.kv, d.tenant, d.id)
	if err != nil {
		return err
	}
	d.b = b
	_, err = readLines(ctx, d.files, d.tenant, b.InputFileID, d.app().Limits.MaxBodyBytes, func(_ int, in *inputLine, perr error) error {
		if perr != nil {
			return perr
		}
		id, _ := lineJob(b, in.CustomID)
		d.jobs = append(d.jobs, id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the input file: %w", err)
	}
	d.done, d.tried = make([]bool, len(d.jobs)), make([]bool, len(d.jobs))
	return nil
}

// stopping reports whether b takes no more lines: it is cancelling, or
// its window is over.
func (d *driver) stopping(b *batchRecord) bool {
	return b.CancellingAt != 0 || !d.now().Before(time.Unix(b.ExpiresAt, 0))
}

// update applies fn to the batch, renewing this runner's lease, unless
// another runner holds it (errLost).
func (d *driver) update(ctx context.Context, fn func(b *batchRecord)) (*batchRecord, error) {
	lost := false
	b, err := updateBatch(ctx, d.kv, d.tenant, d.id, func(b *batchRecord) bool {
		if b.Owner != d.cfg.Holder {
			lost = true
			return false
		}
		b.LeaseUntil = d.now().Add(LeaseTTL).UnixMilli()
		b.Completed, b.Failed = d.counts.completed, d.counts.failed
		fn(b)
		return true
	})
	if err != nil {
		return nil, err
	}
	if lost {
		return nil, errLost
	}
	d.b = b
	return b, nil
}

// renew renews the lease and reads what the batch is asked (a cancel).
func (d *driver) renew(ctx context.Context) (*batchRecord, error) {
	return d.update(ctx, func(*batchRecord) {})
}

// submit accepts the batch's lines from the first not yet submitted, in
// file order, recording its progress as it goes; it ends early (errStop)
// when the batch stops taking lines.
func (d *driver) submit(ctx context.Context) error {
	start := d.b.Submitted
	if _, err := d.update(ctx, func(b *batchRecord) {
		if b.Status == StatusValidating {
			b.Status, b.InProgressAt = StatusInProgress, d.now().Unix()
		}
	}); err != nil {
		return err
	}
	n, last := 0, d.now()
	checkpoint := func() error {
		b, err := d.update(ctx, func(b *batchRecord) { b.Submitted = max(b.Submitted, n) })
		if err == nil && d.stopping(b) {
			return errStop
		}
		last = d.now()
		return err
	}
	_, err := readLines(ctx, d.files, d.tenant, d.b.InputFileID, d.app().Limits.MaxBodyBytes, func(_ int, in *inputLine, perr error) error {
		if perr != nil {
			return perr
		}
		n++
		if n <= start {
			return nil
		}
		if err := d.submitLine(ctx, n, in); err != nil {
			n--
			return err
		}
		if n%checkpointLines == 0 || d.now().Sub(last) >= time.Second {
			return checkpoint()
		}
		return nil
	})
	if err != nil {
		_ = checkpoint() // what was submitted before it stopped
		return err
	}
	return checkpoint()
}

// submitLine accepts line n's job, waiting while Sluice is busy; a job
// accept refuses is the line's error (refusedKey).
func (d *driver) submitLine(ctx context.Context, n int, in *inputLine) error {
	id, key := lineJob(d.b, in.CustomID)
	deadline := time.Unix(d.b.ExpiresAt, 0).UTC()
	for {
		// A fresh job each attempt: accept stamps what it decides on it.
		j := task.New(job.Job{ID: id, Tenant: d.tenant, Priority: job.Batch, IdempotencyKey: key, Deadline: &deadline,
			Endpoint: endpoints[d.b.Endpoint], Request: in.Body})
		_, err := d.accept.Accept(ctx, j)
		var ve *job.ValidationError
		var be *ingest.BusyError
		wait := time.Second
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ve) && ve.Code != ingest.CodeDeadlineUnmeetable:
			return d.refused(ctx, n, ve)
		case errors.As(err, &be):
			wait = min(max(be.RetryAfter, time.Second), 10*time.Second)
		case errors.Is(err, ingest.ErrQueueFull) || errors.As(err, &ve):
			wait = 5 * time.Second
		default:
			d.log.Warn("batch: accept failed, will retry", "batch_id", d.id, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		b, err := d.renew(ctx)
		if err != nil {
			return err
		}
		if d.stopping(b) {
			return errStop
		}
	}
}

// refusal is a line accept refused, as stored under refusedKey.
type refusal struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// refused records line n's refusal; the line has ended, failed.
func (d *driver) refused(ctx context.Context, n int, ve *job.ValidationError) error {
	data, _ := json.Marshal(refusal{Code: ve.Code, Message: ve.Error()})
	if _, err := d.kv.Put(ctx, refusedKey(d.tenant, d.id, n), data); err != nil {
		return err
	}
	if i := n - 1; i < len(d.done) && !d.done[i] {
		d.done[i] = true
		d.counts.failed++
	}
	return nil
}

// poll reads the submitted lines' jobs not yet ended (up to maxLookups),
// cancels those not yet sent when the batch is cancelling, and reports
// whether the batch is done: every submitted line ended, and no line is
// left to submit.
func (d *driver) poll(ctx context.Context) bool {
	b := d.b
	cancelling := b.CancellingAt != 0
	lookups, pending := 0, false
	for i := 0; i < b.Submitted && i < len(d.jobs); i++ {
		if d.done[i] {
			continue
		}
		if lookups == maxLookups {
			return false
		}
		lookups++
		o, err := d.outcome(ctx, i)
		if err != nil {
			return false
		}
		switch {
		case o.ended:
			d.done[i] = true
			if o.succeeded {
				d.counts.completed++
			} else {
				d.counts.failed++
			}
		case cancelling && !d.tried[i] && o.rec != nil:
			d.tried[i] = true
			if _, err := result.CancelQueued(ctx, d.mesh, o.rec); err != nil {
				d.tried[i] = false
			}
			pending = true
		default:
			pending = true
		}
	}
	return !pending && (b.Submitted >= b.Total || d.stopping(b))
}
