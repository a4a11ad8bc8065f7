package admission

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/tracing"
)

// tracer owns how a job's time in admission shows in its trace: its wait
// (since when, why, how it ended) and its placement, each recorded once.
type tracer struct {
	*env
}

// waitTrace is a job's wait in this process as its trace will show it:
// the span context its QUEUE message carries, when the wait began, and
// the reasons it waited for, in the order seen. Its span is recorded
// whole when the wait ends (endWait), so it ends exactly once, whichever
// way the job leaves; a later delivery of the message is a wait of its
// own. Zero when tracing is off.
type waitTrace struct {
	parent  trace.SpanContext
	since   time.Time
	placing time.Time // when its placement began (reserve)
	reasons []string
	deliver uint64 // the message's delivery count
	open    bool
}

// startWait begins the wait of a QUEUE message delivered at now: the
// first delivery's wait began when the job was queued, a redelivery's
// when it came back.
func (tr *tracer) startWait(msg jetstream.Msg, now time.Time) waitTrace {
	if !tr.mesh.Tracing.On() {
		// Its reasons are kept for the job's log line (WaitReason).
		return waitTrace{since: now, open: true}
	}
	w := waitTrace{parent: tr.mesh.Tracing.SpanFromNATS(msg.Headers()), since: now, open: true}
	if md, err := msg.Metadata(); err == nil {
		w.deliver = md.NumDelivered
		if md.NumDelivered == 1 && md.Timestamp.Before(now) {
			w.since = md.Timestamp
		}
	}
	return w
}

// note adds why the job waits now (once in a row; at most maxReasons, the
// latest kept).
func (w *waitTrace) note(reason string) {
	if !w.open || reason == "" || (len(w.reasons) > 0 && w.reasons[len(w.reasons)-1] == reason) {
		return
	}
	if len(w.reasons) == maxReasons {
		w.reasons = append(w.reasons[:0], w.reasons[1:]...)
	}
	w.reasons = append(w.reasons, reason)
}

// maxReasons bounds the reasons one wait records.
const maxReasons = 16

// last is the latest reason the wait recorded ("" if none).
func (w *waitTrace) last() string {
	if len(w.reasons) == 0 {
		return ""
	}
	return w.reasons[len(w.reasons)-1]
}

// endWait records the job's wait, ended at end with outcome, and returns
// its span context (the parent of what follows); nothing when tracing is
// off or the wait was recorded already.
func (tr *tracer) endWait(w *waitTrace, end time.Time, outcome string) trace.SpanContext {
	if !w.open {
		return w.parent
	}
	w.open = false
	reasons := w.reasons
	if len(reasons) == 0 {
		reasons = []string{tracing.ReasonQueued}
	}
	// The job's id, tenant and model are on accept's span, in the same
	// trace.
	attrs := []attribute.KeyValue{tracing.WaitReason.String(reasons[len(reasons)-1]), tracing.WaitReasons.StringSlice(reasons),
		tracing.Outcome.String(outcome)}
	if w.deliver > 1 {
		attrs = append(attrs, tracing.Delivery.Int64(int64(w.deliver)))
	}
	w.parent = tr.mesh.Tracing.Record(w.parent, tracing.SpanWait, w.since, end, attrs...)
	return w.parent
}

// leave records c's wait, ended now with outcome, and returns ctx with
// its span for the result or the message that follows.
func (tr *tracer) leave(ctx context.Context, c *Candidate, outcome string) context.Context {
	if !c.wait.open {
		return ctx
	}
	return trace.ContextWithSpanContext(ctx, tr.endWait(&c.wait, tr.now(), outcome))
}

// queuedCtx is ctx with the trace context of a QUEUE message that ends
// before it waits (expired on arrival).
func (tr *tracer) queuedCtx(ctx context.Context, msg jetstream.Msg) context.Context {
	if !tr.mesh.Tracing.On() {
		return ctx
	}
	return trace.ContextWithSpanContext(ctx, tr.mesh.Tracing.SpanFromNATS(msg.Headers()))
}

// endPlacement records the wait of c, placed on ms, and its placement,
// and returns the placement's span context for DISPATCH's headers.
func (tr *tracer) endPlacement(c *Candidate, ms *modelState, now time.Time) trace.SpanContext {
	if !c.wait.open {
		return c.wait.parent
	}
	start := c.wait.placing
	if start.IsZero() {
		start = now
	}
	j := c.Job
	parent := tr.endWait(&c.wait, start, "placed")
	attrs := []attribute.KeyValue{tracing.Deployment.String(ms.provider + "/" + ms.model)}
	if r := j.Reservation; r != nil && !r.SendAt.IsZero() {
		attrs = append(attrs, tracing.SendAt.String(r.SendAt.Format(time.RFC3339Nano)))
	}
	return tr.mesh.Tracing.Record(parent, tracing.SpanPlacement, start, now, attrs...)
}
