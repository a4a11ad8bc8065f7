package bench

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// spanSink is the OTLP/HTTP receiver the overhead benchmark exports its
// traces to with --trace: on loopback, in a process of its own
// (ServeSpanSink, `sluice bench trace-sink`) as a collector would be, or
// in this one when no command is given (tests). It keeps each export as
// it came and decodes them only when asked (spans), after the measured
// run.
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

// ServeSpanSink runs a span sink on loopback until in ends (the process
// that started it closes it): it writes "url <URL>" as the first line of
// out, and at the end "spans <N>", the spans it received.
func ServeSpanSink(in io.Reader, out io.Writer) error {
	sink := &spanSink{}
	url, stop, err := serve(sink)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(out, "url %s\n", url); err != nil {
		stop()
		return err
	}
	_, _ = io.Copy(io.Discard, in)
	stop()
	n, err := sink.spans()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "spans %d\n", n)
	return err
}

// sinkProcess is a span sink running as a process of its own.
type sinkProcess struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	url string
}

// startSinkProcess starts argv (a command that runs ServeSpanSink) and
// reads its URL.
func startSinkProcess(argv []string) (*sinkProcess, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("trace sink: %w", err)
	}
	p := &sinkProcess{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	if !p.out.Scan() || !strings.HasPrefix(p.out.Text(), "url ") {
		p.kill()
		return nil, fmt.Errorf("trace sink %q did not say its URL", strings.Join(argv, " "))
	}
	p.url = strings.TrimPrefix(p.out.Text(), "url ")
	return p, nil
}

// spans ends the sink and returns the spans it received.
func (p *sinkProcess) spans() (int, error) {
	_ = p.in.Close()
	defer func() { _ = p.cmd.Wait() }()
	if !p.out.Scan() {
		return 0, fmt.Errorf("trace sink ended without a count: %v", p.out.Err())
	}
	n, err := strconv.Atoi(strings.TrimPrefix(p.out.Text(), "spans "))
	if err != nil {
		return 0, fmt.Errorf("trace sink: %q", p.out.Text())
	}
	return n, nil
}

// kill stops the sink without its count (an error path).
func (p *sinkProcess) kill() {
	_ = p.in.Close()
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// traceSink is the overhead run's receiver, wherever it runs; zero when
// the run is not traced.
type traceSink struct {
	url   string
	proc  *sinkProcess
	local *spanSink
	stop  func()
}

// startSink starts the receiver opt asks for and notes it in rep.
func startSink(opt OverheadOptions, rep *OverheadReport) (*traceSink, error) {
	t := &traceSink{stop: func() {}}
	if !opt.Trace {
		return t, nil
	}
	rep.Traced = true
	if len(opt.SinkCommand) > 0 {
		p, err := startSinkProcess(opt.SinkCommand)
		if err != nil {
			return nil, err
		}
		t.url, t.proc, t.stop, rep.SinkProcess = p.url, p, p.kill, true
		return t, nil
	}
	t.local = &spanSink{}
	url, stop, err := serve(t.local)
	if err != nil {
		return nil, err
	}
	t.url, t.stop = url, stop
	return t, nil
}

// count is the spans received; the receiver ends.
func (t *traceSink) count() (int, error) {
	if t.proc != nil {
		t.stop = func() {}
		return t.proc.spans()
	}
	return t.local.spans()
}
