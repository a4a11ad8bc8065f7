// Package tracing is Sluice's OpenTelemetry tracing: the node's tracer,
// set up from the standard OTEL_* variables alone, and the W3C trace
// context carried in HTTP and NATS headers from the caller through
// INTAKE, QUEUE, DISPATCH and RESULTS to the provider.
//
// Tracing is off unless an OTLP endpoint is set: a node then has a nil
// *Tracing, whose methods do nothing and allocate nothing, and no header
// is read or written. The span and attribute names are in names.go.
package tracing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing is a node's tracer. A nil *Tracing is tracing off.
type Tracing struct {
	tp *sdktrace.TracerProvider
	tr trace.Tracer
}

// Settings are what the OTEL_* variables ask for.
type Settings struct {
	Endpoint string // the OTLP/HTTP traces URL; "": tracing is off
	Sampler  sdktrace.Sampler
	Service  string // service.name
	// The batch span processor's OTEL_BSP_SCHEDULE_DELAY,
	// OTEL_BSP_MAX_QUEUE_SIZE and OTEL_BSP_MAX_EXPORT_BATCH_SIZE (0: the
	// SDK's defaults, 5 s, 2048 and 512).
	BatchTimeout       time.Duration
	MaxQueue, MaxBatch int
}

// FromEnv reads the OTEL_* variables Sluice honours. A zero Endpoint means
// tracing is off (no endpoint, OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none). An error names the variable at fault.
func FromEnv(getenv func(string) string) (Settings, error) {
	var s Settings
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return s, nil
	}
	switch e := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); e {
	case "none":
		return s, nil
	case "", "otlp":
	default:
		return s, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: Sluice exports traces over otlp (or none)", e)
	}
	endpoint, err := endpointOf(getenv)
	if err != nil || endpoint == "" {
		return s, err
	}
	proto := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	name := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	if proto == "" {
		proto, name = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_PROTOCOL")), "OTEL_EXPORTER_OTLP_PROTOCOL"
	}
	if proto != "" && proto != "http/protobuf" {
		return s, fmt.Errorf("%s=%q: Sluice exports over http/protobuf (a collector's OTLP/HTTP port, 4318 by default)", name, proto)
	}
	if s.Sampler, err = samplerOf(getenv); err != nil {
		return s, err
	}
	var ms int
	for _, v := range []struct {
		name string
		to   *int
	}{{"OTEL_BSP_SCHEDULE_DELAY", &ms}, {"OTEL_BSP_MAX_QUEUE_SIZE", &s.MaxQueue}, {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", &s.MaxBatch}} {
		if *v.to, err = positive(getenv, v.name); err != nil {
			return s, err
		}
	}
	s.BatchTimeout = time.Duration(ms) * time.Millisecond
	s.Service = cmp.Or(strings.TrimSpace(getenv("OTEL_SERVICE_NAME")), "sluice")
	s.Endpoint = endpoint
	return s, nil
}

// endpointOf is the traces URL: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it
// is, else OTEL_EXPORTER_OTLP_ENDPOINT with /v1/traces appended.
func endpointOf(getenv func(string) string) (string, error) {
	name, v := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
	if v == "" {
		name, v = "OTEL_EXPORTER_OTLP_ENDPOINT", strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
		if v == "" {
			return "", nil
		}
		v = strings.TrimSuffix(v, "/") + "/v1/traces"
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%s: want an http:// or https:// URL", name)
	}
	return v, nil
}

// positive reads a variable that must be a whole number above 0 when set
// (0: unset).
func positive(getenv func(string) string, name string) (int, error) {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q: want a whole number above 0", name, v)
	}
	return n, nil
}

// samplerOf is the sampler OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
// name (default parentbased_always_on).
func samplerOf(getenv func(string) string) (sdktrace.Sampler, error) {
	ratio := 1.0
	if v := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG")); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: want a ratio from 0 to 1", v)
		}
		ratio = r
	}
	switch v := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")); v {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	default:
		return nil, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: want always_on, always_off, traceidratio or their parentbased_ forms", v)
	}
}

// New sets tracing up from the OTEL_* variables getenv reads: nil (off)
// when no endpoint is set. The exporter also honours the variables the
// OpenTelemetry SDK reads itself from the process's environment
// (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE...).
// Nothing is dialed until spans are exported.
func New(ctx context.Context, getenv func(string) string) (*Tracing, error) {
	s, err := FromEnv(getenv)
	if err != nil || s.Endpoint == "" {
		return nil, err
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(s.Endpoint))
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithAttributes(semconv.ServiceName(s.Service)))
	if err != nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	var batch []sdktrace.BatchSpanProcessorOption
	if s.BatchTimeout > 0 {
		batch = append(batch, sdktrace.WithBatchTimeout(s.BatchTimeout))
	}
	if s.MaxQueue > 0 {
		batch = append(batch, sdktrace.WithMaxQueueSize(s.MaxQueue))
	}
	if s.MaxBatch > 0 {
		batch = append(batch, sdktrace.WithMaxExportBatchSize(s.MaxBatch))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, batch...), sdktrace.WithSampler(s.Sampler), sdktrace.WithResource(res))
	return &Tracing{tp: tp, tr: tp.Tracer("github.com/sluice-dev/sluice")}, nil
}

// Shutdown exports what is buffered and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.tp.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("trace export at shutdown: %w", err)
	}
	return nil
}

// On reports whether tracing is on: callers build attributes only then.
func (t *Tracing) On() bool { return t != nil }

// Start starts a span under the span in ctx (or the remote context
// extracted into it). Off, it returns ctx and a span that does nothing.
// The caller ends the span, once.
func (t *Tracing) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t == nil {
		return ctx, noop.Span{}
	}
	ctx, sp := t.tr.Start(ctx, name, opts...)
	noteTraceID(ctx, sp.SpanContext())
	return ctx, sp
}

// Record records a span that already happened, from start to end, under
// parent (a span context from a message's headers, or a span Record
// returned), and returns its span context for the next hop's headers.
// Spans made this way are ended where they are made: exactly once, on
// every path. Off, it returns parent.
func (t *Tracing) Record(parent trace.SpanContext, name string, start, end time.Time, attrs ...attribute.KeyValue) trace.SpanContext {
	if t == nil {
		return parent
	}
	ctx := context.Background()
	if parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, parent)
	}
	_, sp := t.tr.Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	sp.End(trace.WithTimestamp(end))
	return sp.SpanContext()
}

// TraceID is the trace id of the span in ctx; "" when there is none.
func TraceID(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.TraceID().String()
	}
	return ""
}
