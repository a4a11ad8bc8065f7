package ingest

import (
	"cmp"
	"errors"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/job"
)

// endAccept ends accept's span with what accept decided: the job, and
// its outcome (accepted, joined, busy or refused). Off, span does nothing
// and nothing is built.
func endAccept(span trace.Span, j *task.Task, held bool, acc Accepted, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	via := "http"
	if held {
		via = "nats"
	}
	outcome := "accepted"
	var ve *job.ValidationError
	switch {
	case err != nil && errors.Is(err, ErrQueueFull):
		outcome = "busy"
	case errors.As(err, &ve):
		outcome = "refused"
		span.SetAttributes(tracing.ErrorCode.String(ve.Code))
	case err != nil:
		outcome = "error"
	case acc.Joined:
		outcome = "joined"
	}
	span.SetAttributes(tracing.JobID.String(cmp.Or(acc.JobID, j.ID)), tracing.Tenant.String(j.Tenant), tracing.Via.String(via),
		tracing.Priority.String(string(j.Priority)), tracing.GenAIRequestModel.String(j.Model), tracing.Outcome.String(outcome))
	if acc.Joined {
		span.SetAttributes(tracing.Joined.Bool(true))
	}
	if err != nil {
		span.SetStatus(codes.Error, outcome)
	}
	span.End()
}
