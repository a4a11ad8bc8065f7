package tracing

import (
	"context"
	"net/http"
	"sync"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// propagator is the W3C trace context: traceparent and tracestate.
var propagator = propagation.TraceContext{}

// natsCarrier reads and writes the trace context in a NATS message's
// headers. nats.Header is case-sensitive and the propagator names its
// keys in lower case (traceparent, tracestate): they are read and written
// exactly so, never canonicalised.
type natsCarrier nats.Header

func (c natsCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c natsCarrier) Set(key, value string) { c[key] = []string{value} }

func (c natsCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// FromNATS returns ctx with the trace context of a message's headers, as
// the remote parent of the spans started under it. Off, or without a
// traceparent, it returns ctx.
func (t *Tracing) FromNATS(ctx context.Context, h nats.Header) context.Context {
	if t == nil || h == nil {
		return ctx
	}
	return propagator.Extract(ctx, natsCarrier(h))
}

// FromMsg is FromNATS with a message's headers, read only when tracing
// is on.
func (t *Tracing) FromMsg(ctx context.Context, msg interface{ Headers() nats.Header }) context.Context {
	if t == nil {
		return ctx
	}
	return t.FromNATS(ctx, msg.Headers())
}

// SpanFromNATS is the span context of a message's headers (invalid when
// there is none, or tracing is off).
func (t *Tracing) SpanFromNATS(h nats.Header) trace.SpanContext {
	if t == nil || h == nil {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), natsCarrier(h)))
}

// ToNATS writes the trace context of ctx's span into a message's headers
// (nothing when ctx has none: tracing off).
func ToNATS(ctx context.Context, h nats.Header) {
	SpanToNATS(trace.SpanContextFromContext(ctx), h)
}

// SpanToNATS writes sc into a message's headers (nothing when it is
// invalid).
func SpanToNATS(sc trace.SpanContext, h nats.Header) {
	if !sc.IsValid() {
		return
	}
	propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), natsCarrier(h))
}

// ToHTTP writes the trace context of ctx's span into an outgoing request's
// headers: the provider call carries its span's traceparent.
func ToHTTP(ctx context.Context, h http.Header) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// Traceparent is the W3C traceparent of ctx's span; "" when there is none.
func Traceparent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c["traceparent"]
}

// TraceIDOf is the trace id a W3C traceparent names; "" when it names
// none.
func TraceIDOf(traceparent string) string {
	sc := trace.SpanContextFromContext(propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent}))
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// LinkTo links ctx's span to the span a traceparent names (another
// trace's, where the work goes on: a job that joins an earlier one).
func LinkTo(ctx context.Context, traceparent string) {
	span := trace.SpanFromContext(ctx)
	if traceparent == "" || !span.IsRecording() {
		return
	}
	sc := trace.SpanContextFromContext(propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent}))
	if sc.IsValid() {
		span.AddLink(trace.Link{SpanContext: sc})
	}
}

// Handler reads the caller's traceparent and tracestate into each
// request's context, and answers with the trace id (TraceIDHeader) of the
// trace the request belongs to: the caller's, or the one its first span
// starts. Off, it is next.
func (t *Tracing) Handler(next http.Handler) http.Handler {
	if t == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		slot := &idSlot{}
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			slot.id = sc.TraceID()
		}
		next.ServeHTTP(&idWriter{ResponseWriter: w, slot: slot}, r.WithContext(context.WithValue(ctx, slotKey{}, slot)))
	})
}

// idSlot is a request's trace id, known when the caller sent one or
// once the first span of the request starts.
type idSlot struct {
	mu sync.Mutex
	id trace.TraceID
}

type slotKey struct{}

// noteTraceID fills the request's slot (when ctx is a request's and its
// slot is empty) with the trace id of sc.
func noteTraceID(ctx context.Context, sc trace.SpanContext) {
	slot, ok := ctx.Value(slotKey{}).(*idSlot)
	if !ok || !sc.IsValid() {
		return
	}
	slot.mu.Lock()
	if !slot.id.IsValid() {
		slot.id = sc.TraceID()
	}
	slot.mu.Unlock()
}

// idWriter adds the trace id header to an answer as its header is
// written. It unwraps for http.ResponseController (deadlines, flushes).
type idWriter struct {
	http.ResponseWriter
	slot    *idSlot
	stamped bool
}

func (w *idWriter) stamp() {
	if w.stamped {
		return
	}
	w.stamped = true
	w.slot.mu.Lock()
	id := w.slot.id
	w.slot.mu.Unlock()
	if id.IsValid() {
		w.Header().Set(TraceIDHeader, id.String())
	}
}

func (w *idWriter) WriteHeader(code int) {
	w.stamp()
	w.ResponseWriter.WriteHeader(code)
}

func (w *idWriter) Write(b []byte) (int, error) {
	w.stamp()
	return w.ResponseWriter.Write(b)
}

// FlushError flushes through http.ResponseController, stamping first (a
// stream's first flush writes the header).
func (w *idWriter) FlushError() error {
	w.stamp()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap is for http.ResponseController.
func (w *idWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
