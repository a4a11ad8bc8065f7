package systest

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// otlpReceiver is an OTLP/HTTP traces endpoint on loopback that keeps
// every span it is sent, decoded with the OpenTelemetry proto packages.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startOTLP(t *testing.T) (*otlpReceiver, string) {
	t.Helper()
	rc := &otlpReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		data, err := io.ReadAll(body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(data, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				rc.spans = append(rc.spans, ss.GetSpans()...)
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return rc, srv.URL
}

// trace returns the spans received for trace id (hex).
func (rc *otlpReceiver) trace(id string) []*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range rc.spans {
		if hex.EncodeToString(s.GetTraceId()) == id {
			out = append(out, s)
		}
	}
	return out
}

func attr(s *tracepb.Span, key string) *commonpb.AnyValue {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue()
		}
	}
	return nil
}

func named(spans []*tracepb.Span, prefix string) []*tracepb.Span {
	var out []*tracepb.Span
	for _, s := range spans {
		if strings.HasPrefix(s.GetName(), prefix) {
			out = append(out, s)
		}
	}
	return out
}

// traceparent makes a caller's W3C traceparent: its trace id, its span id.
func traceparent(n int) (header, traceID, spanID string) {
	traceID = fmt.Sprintf("%032x", 0xabc0000+n)
	spanID = fmt.Sprintf("%016x", 0xcafe00+n)
	return "00-" + traceID + "-" + spanID + "-01", traceID, spanID
}

// TestTraces follows jobs from the caller's span through every hop to the
// provider: a job posted over HTTP with a traceparent yields one trace
// under the caller's span (accept, wait with its reason, placement, the
// GenAI call, result), with no prompt text in any attribute; a retried job
// shows both calls; a job published on INTAKE with the header joins its
// trace; the provider receives the call's traceparent; the trace id is in
// the HTTP answer and on the result.
func TestTraces(t *testing.T) {
	t.Parallel()
	rc, otlpURL := startOTLP(t)
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini"}}, APIKeys: []string{"sim-secret"},
		Faults: sim.Faults{Rate500: 1, MaxFaults: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var pmu sync.Mutex
	var parents []string // the traceparent of each provider call
	simSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pmu.Lock()
		parents = append(parents, r.Header.Get("traceparent"))
		pmu.Unlock()
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(simSrv.Close)
	env := maps.Clone(Env)
	env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlpURL
	env["OTEL_BSP_SCHEDULE_DELAY"] = "50"
	cfg := SimConfig(simSrv.URL, "gpt-4o-mini", 600, 1_000_000, `
retry:
  interactive: {max_attempts: 3, max_elapsed: 20s, base_delay: 10ms, max_delay: 50ms}
  standard: {max_attempts: 3, max_elapsed: 20s, base_delay: 10ms, max_delay: 50ms}
`)
	n := StartLogged(t, cfg, env)
	const secret = "zebracanary"
	post := func(tp, idemKey string) string {
		body := fmt.Sprintf(`{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"say %s twice"}]}`, secret)
		req, _ := http.NewRequest(http.MethodPost, n.HTTP+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer acme-key")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", tp)
		if idemKey != "" {
			req.Header.Set("Idempotency-Key", idemKey)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat: %d", resp.StatusCode)
		}
		return resp.Header.Get("X-Sluice-Trace-Id")
	}

	// The first call the provider gets fails (500): this job is retried.
	tpA, traceA, _ := traceparent(1)
	if got := post(tpA, ""); got != traceA {
		t.Errorf("retried job: X-Sluice-Trace-Id %q, want the caller's %q", got, traceA)
	}
	tpB, traceB, callerB := traceparent(2)
	if got := post(tpB, ""); got != traceB {
		t.Errorf("X-Sluice-Trace-Id %q, want the caller's %q", got, traceB)
	}
	checkTrace(t, rc, traceB, callerB, secret)
	checkRetried(t, rc, traceA)
	checkProviderParent(t, rc, traceB, func() []string { pmu.Lock(); defer pmu.Unlock(); return copyOf(parents) })
	checkNATS(t, n, rc)
	checkSurfaces(t, n)

	// A job that joins an earlier one (the same Idempotency-Key) links its
	// trace to the first job's, where the work is.
	tpD, traceD, _ := traceparent(4)
	post(tpD, "join-me")
	tpE, traceE, _ := traceparent(5)
	post(tpE, "join-me")
	accept := named(waitSpans(t, rc, traceE, map[string]int{"sluice.accept": 1}), "sluice.accept")[0]
	if got := attr(accept, "sluice.joined"); !got.GetBoolValue() {
		t.Errorf("second submission: sluice.joined %v, want true", got)
	}
	if l := accept.GetLinks(); len(l) != 1 || hex.EncodeToString(l[0].GetTraceId()) != traceD {
		t.Errorf("joined job's accept links %v, want one to the first job's trace %s", l, traceD)
	}
}

func copyOf(s []string) []string { return append([]string(nil), s...) }

// waitSpans waits until the trace has spans with each name prefix.
func waitSpans(t *testing.T, rc *otlpReceiver, traceID string, want map[string]int) []*tracepb.Span {
	t.Helper()
	var spans []*tracepb.Span
	natstest.Eventually(t, 30*time.Second, func() error {
		spans = rc.trace(traceID)
		for prefix, n := range want {
			if got := len(named(spans, prefix)); got < n {
				return fmt.Errorf("trace %s: %d spans named %s*, want %d (of %d spans)", traceID, got, prefix, n, len(spans))
			}
		}
		return nil
	})
	return spans
}

// checkTrace checks the trace of one job posted over HTTP under the
// caller's span.
func checkTrace(t *testing.T, rc *otlpReceiver, traceID, callerSpan, secret string) {
	t.Helper()
	spans := waitSpans(t, rc, traceID, map[string]int{"sluice.accept": 1, "sluice.wait": 1, "sluice.placement": 1, "chat gpt-4o-mini": 1, "sluice.result": 1})
	ids := map[string]bool{}
	for _, s := range spans {
		ids[hex.EncodeToString(s.GetSpanId())] = true
	}
	for _, s := range spans {
		parent := hex.EncodeToString(s.GetParentSpanId())
		if parent != callerSpan && !ids[parent] {
			t.Errorf("span %s: parent %q is neither the caller's span nor one of the trace's", s.GetName(), parent)
		}
		for _, kv := range s.GetAttributes() {
			if strings.Contains(kv.GetValue().String(), secret) {
				t.Errorf("span %s: attribute %s holds the prompt's text", s.GetName(), kv.GetKey())
			}
		}
	}
	accept := named(spans, "sluice.accept")[0]
	if got := hex.EncodeToString(accept.GetParentSpanId()); got != callerSpan {
		t.Errorf("accept's parent %s, want the caller's span %s", got, callerSpan)
	}
	wait := named(spans, "sluice.wait")[0]
	if r := attr(wait, "sluice.wait.reason"); r.GetStringValue() == "" {
		t.Errorf("wait span without a reason: %v", wait.GetAttributes())
	}
	call := answered(t, spans)
	if call.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("call span kind %v, want client", call.GetKind())
	}
	for key, want := range map[string]string{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o-mini",
		"server.address": "127.0.0.1"} {
		if got := attr(call, key).GetStringValue(); got != want {
			t.Errorf("call %s = %q, want %q", key, got, want)
		}
	}
	for _, key := range []string{"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.request.max_tokens"} {
		if got := attr(call, key).GetIntValue(); got <= 0 {
			t.Errorf("call %s = %d, want > 0", key, got)
		}
	}
	if attr(call, "gen_ai.response.id").GetStringValue() == "" || len(attr(call, "gen_ai.response.finish_reasons").GetArrayValue().GetValues()) == 0 {
		t.Errorf("call without response id or finish reasons: %v", call.GetAttributes())
	}
	if got := attr(named(spans, "sluice.result")[0], "sluice.status").GetStringValue(); got != string(job.StatusSucceeded) {
		t.Errorf("result span status %q, want succeeded", got)
	}
}

// answered is the trace's call span that the provider answered (no
// error.type). A loaded machine may add an attempt before it: a paced
// call refused as late by its executor never leaves (error.type connect)
// and is placed again.
func answered(t *testing.T, spans []*tracepb.Span) *tracepb.Span {
	t.Helper()
	for _, s := range named(spans, "chat gpt-4o-mini") {
		if attr(s, "error.type").GetStringValue() == "" {
			return s
		}
	}
	t.Fatalf("no call span without an error among %d spans", len(spans))
	return nil
}

// checkRetried checks that a retried job's trace shows both calls: the
// first failed with the provider's 500.
func checkRetried(t *testing.T, rc *otlpReceiver, traceID string) {
	t.Helper()
	spans := waitSpans(t, rc, traceID, map[string]int{"chat gpt-4o-mini": 2, "sluice.result": 1})
	// An attempt's number may show twice: a call refused as late by its
	// executor (a loaded machine) never left and spent no attempt.
	attempts := map[int64][]string{}
	for _, s := range named(spans, "chat gpt-4o-mini") {
		n := attr(s, "sluice.attempt").GetIntValue()
		attempts[n] = append(attempts[n], attr(s, "error.type").GetStringValue())
	}
	if !slices.Contains(attempts[1], "500") {
		t.Errorf("attempt 1: error types %q, want the provider's 500", attempts[1])
	}
	if !slices.Contains(attempts[2], "") {
		t.Errorf("attempt 2: error types %q, want a success", attempts[2])
	}
}

// checkProviderParent checks that the provider was sent the call span's
// traceparent.
func checkProviderParent(t *testing.T, rc *otlpReceiver, traceID string, parents func() []string) {
	t.Helper()
	call := answered(t, rc.trace(traceID))
	want := "00-" + traceID + "-" + hex.EncodeToString(call.GetSpanId()) + "-01"
	for _, p := range parents() {
		if p == want {
			return
		}
	}
	t.Errorf("the provider never received traceparent %s (got %v)", want, parents())
}

// checkNATS publishes a job on INTAKE with a traceparent header and checks
// that its spans join the caller's trace and its result carries the trace
// id.
func checkNATS(t *testing.T, n Node, rc *otlpReceiver) {
	t.Helper()
	nc, cl := n.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	tp, traceID, callerSpan := traceparent(3)
	id := job.NewID()
	data, _ := json.Marshal(&job.Job{ID: id, Tenant: "acme", Request: ChatBody("gpt-4o-mini", 5, 16)})
	msg := &nats.Msg{Subject: job.IntakeSubject("acme"), Data: data, Header: nats.Header{}}
	msg.Header["traceparent"] = []string{tp}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	res, err := cl.Await(ctx, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	if res.TraceID != traceID {
		t.Errorf("result trace_id %q, want the caller's %q", res.TraceID, traceID)
	}
	spans := waitSpans(t, rc, traceID, map[string]int{"sluice.accept": 1, "chat gpt-4o-mini": 1, "sluice.result": 1})
	accept := named(spans, "sluice.accept")[0]
	if got := hex.EncodeToString(accept.GetParentSpanId()); got != callerSpan {
		t.Errorf("NATS accept's parent %s, want the caller's span %s", got, callerSpan)
	}
	if got := attr(accept, "sluice.via").GetStringValue(); got != "nats" {
		t.Errorf("accept via %q, want nats", got)
	}
}

// checkSurfaces sends a traceparent to every API surface: each answer,
// a refusal included, carries the caller's trace id; a streamed answer
// still streams.
func checkSurfaces(t *testing.T, n Node) {
	t.Helper()
	for i, tc := range []struct{ path, body string }{
		{"/v1/jobs", `{"request":{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}}`},
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/messages", `{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/responses", `{"model":"gpt-4o-mini","input":"hi","max_output_tokens":16}`},
		{"/v1/embeddings", `{"model":"gpt-4o-mini","input":"hi"}`},
	} {
		tp, traceID, _ := traceparent(10 + i)
		req, _ := http.NewRequest(http.MethodPost, n.HTTP+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer acme-key")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("traceparent", tp)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("%s: %d", tc.path, resp.StatusCode)
		if got := resp.Header.Get("X-Sluice-Trace-Id"); got != traceID {
			t.Errorf("%s (%d): X-Sluice-Trace-Id %q, want %q", tc.path, resp.StatusCode, got, traceID)
		}
		if resp.StatusCode >= 500 {
			t.Errorf("%s: %d %s", tc.path, resp.StatusCode, body)
		}
		if strings.Contains(tc.body, `"stream":true`) && !strings.Contains(string(body), "[DONE]") {
			t.Errorf("%s streamed: %d %q, want an event stream ending [DONE]", tc.path, resp.StatusCode, body)
		}
	}
}
