package bench

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// spanSink is the OTLP/HTTP receiver the overhead benchmark exports its
// traces to with --trace: on loopback, in process. It keeps each export
// as it came and decodes them only when asked (spans), after the measured
// run: a collector decodes in a process of its own, so the decoding is
// not Sluice's cost.
type spanSink struct {
	mu      sync.Mutex
	exports [][]byte
}

func (s *spanSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.exports = append(s.exports, data)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(nil) // an empty ExportTraceServiceResponse: full success
}

// spans decodes what was exported and counts the spans.
func (s *spanSink) spans() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, data := range s.exports {
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(data, &req); err != nil {
			return n, fmt.Errorf("trace export: %w", err)
		}
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				n += len(ss.GetSpans())
			}
		}
	}
	return n, nil
}

// traceEnv is the node's environment for a traced run: every trace
// sampled, exported to the sink at url, in batches large enough that a
// burst of thousands of jobs drops no span.
func traceEnv(url string) map[string]string {
	return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_TRACES_SAMPLER": "always_on",
		"OTEL_BSP_MAX_QUEUE_SIZE": strconv.Itoa(1 << 16)}
}
