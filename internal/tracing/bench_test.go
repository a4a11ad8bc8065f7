//go:build unix

package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"
)

// BenchmarkJobSpans is the tracing work of one job as the mesh does it,
// with the real exporter sending to a loopback receiver that discards:
// accept, wait and placement (recorded), the call (a dozen GenAI
// attributes), result, and the five header writes and reads between
// hops. cpu-us/job is the process's CPU (user + system, the exporter's
// goroutine included) per job; compare with `sluice bench overhead`'s
// CPU per job.
func BenchmarkJobSpans(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "off", true: "on"}[on]
		b.Run(name, func(b *testing.B) {
			var tr *Tracing
			if on {
				sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
				}))
				defer sink.Close()
				var err error
				tr, err = New(context.Background(), env("OTEL_EXPORTER_OTLP_ENDPOINT", sink.URL, "OTEL_BSP_MAX_QUEUE_SIZE", "65536"))
				if err != nil {
					b.Fatal(err)
				}
				defer func() { _ = tr.Shutdown(context.Background()) }()
			}
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				oneJob(tr)
			}
			if on {
				_ = tr.tp.ForceFlush(context.Background())
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N)/1e3, "cpu-us/job")
		})
	}
}

// oneJob is what the hops of one job do with tracing.
func oneJob(tr *Tracing) {
	ctx := context.Background()
	h := nats.Header{}
	actx, accept := tr.Start(ctx, SpanAccept)
	if accept.IsRecording() {
		accept.SetAttributes(JobID.String("01a23a8d-7b6c-7813-9e58-0df9d18e597f"), Tenant.String("acme"), Via.String("http"),
			Priority.String("standard"), GenAIRequestModel.String("gpt-4o-mini"), Outcome.String("accepted"))
	}
	accept.End()
	ToNATS(actx, h)
	now := time.Now()
	wait := tr.Record(tr.SpanFromNATS(h), SpanWait, now, now, WaitReason.String("queued"), WaitReasons.StringSlice([]string{"queued"}),
		Outcome.String("placed"))
	d := nats.Header{}
	SpanToNATS(tr.Record(wait, SpanPlacement, now, now, Deployment.String("sim/gpt-4o-mini"), SendAt.String(now.Format(time.RFC3339Nano))), d)
	cctx, call := tr.Start(tr.FromNATS(ctx, d), CallName(OperationChat, "gpt-4o-mini"), trace.WithSpanKind(trace.SpanKindClient))
	if call.IsRecording() {
		call.SetAttributes(GenAIOperation.String("chat"), GenAIRequestModel.String("gpt-4o-mini"), GenAIStream.Bool(false),
			Attempt.Int(1), GenAIMaxTokens.Int(16), GenAIProvider.String("openai"), ServerAddress.String("127.0.0.1"))
	}
	ToHTTP(cctx, http.Header{})
	if call.IsRecording() {
		call.SetAttributes(GenAIResponseID.String("chatcmpl-1"), GenAIResponseModel.String("gpt-4o-mini"), GenAIFinishReasons.StringSlice([]string{"stop"}),
			GenAIInputTokens.Int(12), GenAIOutputTokens.Int(8))
	}
	call.End()
	r := nats.Header{}
	ToNATS(cctx, r)
	_, res := tr.Start(tr.FromNATS(ctx, r), SpanResult)
	if res.IsRecording() {
		res.SetAttributes(Status.String("succeeded"), Attempt.Int(1), Outcome.String("recorded"))
	}
	res.End()
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
