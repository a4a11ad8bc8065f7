package tracing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestFromEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		getenv   func(string) string
		endpoint string // "": off
		err      string // a part of the error naming the variable
	}{
		{"nothing set", env(), "", ""},
		{"base endpoint", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/"), "http://127.0.0.1:4318/v1/traces", ""},
		{"traces endpoint as is", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://b/x"), "https://b/x", ""},
		{"disabled", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318", "OTEL_SDK_DISABLED", "true"), "", ""},
		{"exporter none", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318", "OTEL_TRACES_EXPORTER", "none"), "", ""},
		{"exporter zipkin", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318", "OTEL_TRACES_EXPORTER", "zipkin"), "", "OTEL_TRACES_EXPORTER"},
		{"grpc", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), "", "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{"not a url", env("OTEL_EXPORTER_OTLP_ENDPOINT", "a:4318"), "", "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"bad sampler", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a", "OTEL_TRACES_SAMPLER", "sometimes"), "", "OTEL_TRACES_SAMPLER"},
		{"bad ratio", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a", "OTEL_TRACES_SAMPLER", "traceidratio", "OTEL_TRACES_SAMPLER_ARG", "2"), "", "OTEL_TRACES_SAMPLER_ARG"},
		{"bad delay", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a", "OTEL_BSP_SCHEDULE_DELAY", "soon"), "", "OTEL_BSP_SCHEDULE_DELAY"},
	} {
		s, err := FromEnv(tc.getenv)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: got error %v, want one naming %s", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || s.Endpoint != tc.endpoint {
			t.Errorf("%s: got endpoint %q, error %v; want %q", tc.name, s.Endpoint, err, tc.endpoint)
		}
	}
}

// TestSampler: the sampler variables choose the sampler.
func TestSampler(t *testing.T) {
	t.Parallel()
	s, err := FromEnv(env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a", "OTEL_TRACES_SAMPLER", "traceidratio", "OTEL_TRACES_SAMPLER_ARG", "0.25"))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Sampler.Description(); got != "TraceIDRatioBased{0.25}" {
		t.Errorf("sampler %s, want TraceIDRatioBased{0.25}", got)
	}
	s, _ = FromEnv(env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a"))
	if got := s.Sampler.Description(); !strings.HasPrefix(got, "ParentBased{root:AlwaysOnSampler") {
		t.Errorf("default sampler %s, want parentbased_always_on", got)
	}
}

func testTracing(t *testing.T) (*Tracing, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &Tracing{tp: tp, tr: tp.Tracer("test")}, exp
}

var time0 time.Time

const callerTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// TestNATSHeaders: the context is written under the exact lower-case
// keys of the W3C format and read back from them, and only from them
// (nats.Header is case-sensitive).
func TestNATSHeaders(t *testing.T) {
	t.Parallel()
	tr, _ := testTracing(t)
	h := nats.Header{}
	h["traceparent"] = []string{callerTP}
	ctx, sp := tr.Start(tr.FromNATS(context.Background(), h), "hop")
	sp.End()
	if got := sp.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("span under a NATS traceparent: trace %s, want the caller's", got)
	}
	out := nats.Header{}
	ToNATS(ctx, out)
	if v := out["traceparent"]; len(v) != 1 || !strings.Contains(v[0], sp.SpanContext().SpanID().String()) {
		t.Errorf("written headers %v, want traceparent naming span %s", out, sp.SpanContext().SpanID())
	}
	if tr.SpanFromNATS(nats.Header{"Traceparent": {callerTP}}).IsValid() {
		t.Error("a capitalised Traceparent header was read; only the W3C key is")
	}
}

// TestHandlerTraceID: an answer carries the trace id of the caller's
// traceparent, or of the first span its request started, and none when
// there is no trace.
func TestHandlerTraceID(t *testing.T) {
	t.Parallel()
	tr, _ := testTracing(t)
	var started trace.SpanContext
	h := tr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/span" {
			_, sp := tr.Start(r.Context(), "accept")
			started = sp.SpanContext()
			sp.End()
		}
		_, _ = w.Write([]byte("ok"))
	}))
	for _, tc := range []struct {
		path, traceparent string
		want              func() string
	}{
		{"/", callerTP, func() string { return "4bf92f3577b34da6a3ce929d0e0e4736" }},
		{"/", "", func() string { return "" }},
		{"/span", "", func() string { return started.TraceID().String() }},
	} {
		req := httptest.NewRequest(http.MethodGet, tc.path, nil)
		if tc.traceparent != "" {
			req.Header.Set("traceparent", tc.traceparent)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if got := rec.Header().Get(TraceIDHeader); got != tc.want() {
			t.Errorf("%s traceparent %q: %s %q, want %q", tc.path, tc.traceparent, TraceIDHeader, got, tc.want())
		}
	}
}

// TestOffAllocatesNothing: with tracing off (a nil *Tracing) the per-job
// calls allocate nothing.
func TestOffAllocatesNothing(t *testing.T) {
	var off *Tracing
	ctx := context.Background()
	h := nats.Header{"traceparent": {callerTP}}
	allocs := testing.AllocsPerRun(100, func() {
		c, sp := off.Start(off.FromNATS(ctx, h), SpanAccept)
		ToNATS(c, h)
		off.Record(off.SpanFromNATS(h), SpanWait, time0, time0)
		sp.End()
	})
	if allocs != 0 {
		t.Errorf("tracing off: %.0f allocations per job's calls, want 0", allocs)
	}
}
