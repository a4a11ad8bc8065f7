package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
)

// wantsStream reads a chat-completions body's stream flag and whether it
// asks for the usage chunk.
func wantsStream(body []byte) (stream, usage bool) {
	var f struct {
		Stream        bool `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if json.Unmarshal(body, &f) != nil {
		return false, false
	}
	return f.Stream, f.Stream && f.StreamOptions != nil && f.StreamOptions.IncludeUsage
}

// streamChat answers a request with stream: true (chat completions,
// messages, responses), for a job already accepted: Server-Sent Events in f's
// format (OpenAI's chunks, or Anthropic's events), relayed from the job's
// stream subject (any process serving HTTP can relay any job), keep-alives
// while nothing comes (the job may wait in the queue), f's end marker at a
// successful end, and an error event otherwise. When the
// client goes away first, the job is cancelled if
// streaming.cancel_on_disconnect says so for its priority.
func (s *pipeline) streamChat(w http.ResponseWriter, r *http.Request, j *task.Task, acc Accepted, usage bool, f eventFormat) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()

	ctx, stop := context.WithCancel(r.Context())
	defer stop()
	type item struct {
		m   *job.StreamMessage
		err error
	}
	items := make(chan item)
	go func() {
		defer close(items)
		for m, err := range client.Follow(ctx, s.mesh.JS, acc.Tenant, acc.JobID, usage) {
			select {
			case items <- item{m, err}:
			case <-ctx.Done():
				return
			}
		}
	}()
	keepAlive := time.NewTicker(s.app().Streaming.KeepAlive.D())
	defer keepAlive.Stop()
	gone := func() {
		if !acc.Joined && s.app().Streaming.Cancels(j.Priority) {
			s.Cancel(context.WithoutCancel(r.Context()), acc.Tenant, acc.JobID, j.IdempotencyKey)
		}
	}
	for {
		// The connection lives as long as the stream does: each event (or
		// keep-alive) moves its deadlines on, past the server's timeouts.
		api.ExtendDeadlines(w, s.app().Streaming.KeepAlive.D()+deadlineSlack)
		select {
		case it, ok := <-items:
			if !ok {
				return
			}
			if it.err != nil {
				if r.Context().Err() != nil {
					gone()
					return
				}
				f.fail(w, "sluice_error", "unavailable", "the stream could not be read; the job goes on: GET /v1/jobs/"+acc.JobID, http.StatusServiceUnavailable, api.RequestID(r.Context()))
				_ = rc.Flush()
				return
			}
			ok = true
			for _, c := range it.m.Chunks {
				ok = ok && f.chunk(w, c)
			}
			if end := it.m.End; end != "" {
				if end == job.StatusSucceeded {
					ok = ok && f.done(w)
				} else {
					code, msg := string(end), "the job did not succeed"
					if e := it.m.Error; e != nil {
						code, msg = e.Code, e.Message
					}
					ok = ok && f.fail(w, "sluice_"+string(end), code, msg, failureStatus(end, code), api.RequestID(r.Context()))
				}
				_ = rc.Flush()
				return
			}
			if !ok || rc.Flush() != nil {
				gone()
				return
			}
			keepAlive.Reset(s.app().Streaming.KeepAlive.D())
		case <-keepAlive.C:
			if !f.keepAlive(w) || rc.Flush() != nil {
				gone()
				return
			}
		case <-r.Context().Done():
			gone()
			return
		}
	}
}

func writeEvent(w io.Writer, data []byte) bool {
	buf := make([]byte, 0, len(data)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	_, err := w.Write(buf)
	return err == nil
}

// errorEvent is an error in OpenAI's shape, as OpenAI sends one inside a
// stream; the official SDKs end the stream with it as an error. rid, the
// request's id, is the error's request_id.
func errorEvent(typ, code, msg, rid string) []byte {
	e := map[string]any{"message": msg, "type": typ, "code": code, "param": nil}
	if rid != "" {
		e["request_id"] = rid
	}
	b, _ := json.Marshal(map[string]any{"error": e})
	return b
}

// Cancel asks for a job to stop: its operation record is marked cancelled
// (an executor that has not called the provider yet ends the job
// cancelled) and sluice.cancel.<tenant>.<job_id> tells the executor
// running it to stop the call. A job other submissions joined is not
// cancelled (they still wait for it); nor is one already done.
func (s *pipeline) Cancel(ctx context.Context, tenant, jobID, idemKey string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	opKey, _ := mesh.OpKey(tenant, idemKey, jobID)
	mark := true
	_, err := s.mesh.UpdateOp(ctx, opKey, func(r *mesh.OpRecord) bool {
		if r.JobID != jobID || len(r.Joiners) > 0 || r.State == mesh.OpCompleted || r.State == mesh.OpFailed || r.Cancelled {
			mark = r.Cancelled
			return false
		}
		r.Cancelled = true
		return true
	})
	if err != nil && !errors.Is(err, job.ErrNotFound) {
		s.log.Warn("cancel: op record", "job_id", jobID, "err", err)
	}
	if !mark {
		return
	}
	if err := s.mesh.JS.Conn().Publish(job.CancelSubject(tenant, jobID), nil); err != nil {
		s.log.Warn("cancel: publish", "job_id", jobID, "err", err)
	}
}
