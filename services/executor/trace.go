package executor

import (
	"errors"
	"net/url"
	"strconv"
	"sync"

	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/job"
)

// startCall starts the provider call's span, a GenAI client span (one
// per attempt: a retried job shows each). Off, nothing is built.
func (s *caller) startCall(ctx context.Context, a *attempt) (context.Context, trace.Span) {
	if !s.mesh.Tracing.On() {
		return ctx, trace.SpanFromContext(context.Background())
	}
	j := a.j
	op := tracing.OperationChat
	if j.Endpoint == job.EndpointEmbeddings {
		op = tracing.OperationEmbeddings
	}
	model := j.Model
	if a.upstream != "" {
		model = a.upstream
	}
	// The job's id and tenant are on accept's span, its deployment on the
	// placement's, in the same trace.
	attrs := []attribute.KeyValue{tracing.GenAIOperation.String(op), tracing.GenAIRequestModel.String(model),
		tracing.GenAIStream.Bool(a.stream), tracing.Attempt.Int(a.n)}
	if j.Estimate != nil && j.Endpoint != job.EndpointEmbeddings {
		attrs = append(attrs, tracing.GenAIMaxTokens.Int(j.Estimate.MaxTokens))
	}
	if p, _, ok := s.app().Deployment(j.Provider, j.Model); ok {
		attrs = append(attrs, tracing.GenAIProvider.String(tracing.ProviderName(p.Kind)))
		if h := hostOf(p.BaseURL); h != "" {
			attrs = append(attrs, tracing.ServerAddress.String(h))
		}
	}
	return s.mesh.Tracing.Start(ctx, tracing.CallName(op, model), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// endCall ends the call's span with what came back: the answer's id,
// model, finish reasons and usage, or the error's type (the HTTP status,
// or how far a failed call got).
func (s *caller) endCall(span trace.Span, a *attempt) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	var te *provider.TransportError
	switch {
	case errors.As(a.cerr, &te):
		span.SetAttributes(tracing.ErrorType.String(string(te.Phase)))
		span.SetStatus(codes.Error, string(te.Phase))
	case a.cerr != nil:
		span.SetAttributes(tracing.ErrorType.String("_OTHER"))
		span.SetStatus(codes.Error, "")
	case a.resp == nil:
	case a.resp.Status >= 400:
		span.SetAttributes(tracing.ErrorType.String(strconv.Itoa(a.resp.Status)))
		span.SetStatus(codes.Error, "")
	default:
		// One SetAttributes: each call grows the span's attributes anew.
		u := a.resp.Usage
		attrs := make([]attribute.KeyValue, 0, 7)
		attrs = append(attrs, tracing.GenAIInputTokens.Int(u.PromptTokens), tracing.GenAIOutputTokens.Int(u.CompletionTokens))
		if u.CachedTokens > 0 || u.CacheWriteTokens > 0 {
			attrs = append(attrs, tracing.GenAICacheReadTokens.Int(u.CachedTokens), tracing.GenAICacheWrite.Int(u.CacheWriteTokens))
		}
		if a.end == nil {
			m := a.resp.Answer
			if m.ID == "" && m.Model == "" && len(m.FinishReasons) == 0 {
				_, m = provider.ParseAnswer(a.resp.Body) // the client did not read it (Anthropic)
			}
			attrs = append(attrs, tracing.GenAIResponseID.String(m.ID), tracing.GenAIResponseModel.String(m.Model), tracing.GenAIFinishReasons.StringSlice(m.FinishReasons))
		}
		span.SetAttributes(attrs...)
	}
}

// hosts caches each configured base URL's host name (server.address): a
// few per configuration, parsed once instead of on every call.
var hosts sync.Map // base URL -> host name

func hostOf(baseURL string) string {
	if h, ok := hosts.Load(baseURL); ok {
		return h.(string)
	}
	h := ""
	if u, err := url.Parse(baseURL); err == nil {
		h = u.Hostname()
	}
	hosts.Store(baseURL, h)
	return h
}
