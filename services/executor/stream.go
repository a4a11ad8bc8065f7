package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jsonv1 "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// streamer owns relaying a streamed answer: the call's chunks to the
// job's stream subject, how a stream ends, its caller's cancellation, and
// resuming one a lost executor left mid-stream (resume.go).
type streamer struct {
	*env
	fin     *finisher
	fb      *feedback
	running cancels // streamed jobs in this process, for cancellation
}

// errCancelled is the cause of a call stopped because its caller cancelled.
var errCancelled = errors.New("cancelled by the caller")

// streamFlags is what the executor reads of a streamed request.
type streamFlags struct {
	Stream        bool `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// streamed reports whether j asks for a streamed answer, and whether its
// caller asked for the usage chunk.
func streamed(j *task.Task) (stream, usage bool) {
	var f streamFlags
	if jsonv1.Unmarshal(task.Members(j.Request, "stream", "stream_options"), &f) != nil {
		return false, false
	}
	return f.Stream, f.Stream && f.StreamOptions != nil && f.StreamOptions.IncludeUsage
}

// cancels maps the jobs this process is running to their cancel functions,
// for sluice.cancel.<tenant>.<job_id>.
type cancels struct {
	mu sync.Mutex
	m  map[string]context.CancelCauseFunc
}

func (c *cancels) add(id string, f context.CancelCauseFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]context.CancelCauseFunc{}
	}
	c.m[id] = f
}

func (c *cancels) remove(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
}

func (c *cancels) cancel(id string) bool {
	c.mu.Lock()
	f := c.m[id]
	c.mu.Unlock()
	if f != nil {
		f(errCancelled)
	}
	return f != nil
}

// onCancel handles sluice.cancel.<tenant>.<job_id>.
func (s *streamer) onCancel(m *nats.Msg) {
	rest, _ := strings.CutPrefix(m.Subject, job.CancelPrefix)
	tenant, id, ok := strings.Cut(rest, ".")
	if !ok {
		return
	}
	if s.running.cancel(keys.Job(tenant, id)) {
		s.log.Info("stream cancelled by its caller", "job_id", id)
		if mesh.ReplyAllowed(m.Reply, "") {
			_ = m.Respond([]byte(`{"cancelled":true}`)) // the call is being stopped (a cancel's request)
		}
	}
}

// streamEnd is how a streamed call ended once it got past its first token
// (or ended cleanly, or was cancelled): the job ends here, never retried.
type streamEnd struct {
	status job.Status // succeeded, interrupted, cancelled, or failed (too_large)
	// reason: interrupted: cut, idle_timeout, total_timeout, error_event,
	// executor_lost; cancelled; too_large.
	reason string
	tr     *job.Transcript
	err    error // what broke the stream
	// resumeStream's: endErr is the error an earlier attempt's end marker
	// carried; unsettled leaves the budget as it is (the usage was an
	// earlier reservation's).
	endErr    *job.Error
	unsettled bool
}

// stream runs a streamed call. Before the first token (a content,
// refusal or tool-call delta) nothing is published and a failure comes
// back as resp and cerr for Classify, exactly as a non-streamed call's;
// end is then nil. After it, chunks go to the job's stream subject as they
// come, batched by time, and end says how the stream ended.
func (s *streamer) stream(ctx context.Context, j *task.Task, client provider.Streamer, call provider.Call, wantUsage bool, pub *chunkPublisher) (resp *provider.Response, cerr error, end *streamEnd) {
	cfg := s.app().Streaming
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// One timer: the first-token timeout, then the idle timeout.
	var first atomic.Bool
	timer := time.AfterFunc(cfg.FirstTokenTimeout.D(), func() {
		if first.Load() {
			cancel(provider.ErrIdleTimeout)
			return
		}
		cancel(provider.ErrFirstTokenTimeout)
	})
	defer timer.Stop()
	start := s.now()
	labels := []string{j.Provider, j.Model}

	resp, st, err := client.Stream(sctx, call)
	if err != nil || st == nil {
		if errors.Is(context.Cause(sctx), errCancelled) {
			return resp, err, &streamEnd{status: job.StatusCancelled, reason: "cancelled", tr: &job.Transcript{}, err: errCancelled}
		}
		return resp, err, nil
	}
	defer st.Close()
	tr := &job.Transcript{}
	var held []json.RawMessage // chunks before the first token
	for {
		c, err := st.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				// A clean end, with or without output.
				pub.add(held...)
				return resp, nil, &streamEnd{status: job.StatusSucceeded, tr: tr}
			}
			cause := context.Cause(sctx)
			reason, broke := streamBreak(err, cause)
			if errors.Is(cause, errCancelled) {
				return resp, nil, &streamEnd{status: job.StatusCancelled, reason: "cancelled", tr: tr, err: errCancelled}
			}
			if errors.Is(err, provider.ErrBodyTooLarge) && tr.Started() {
				// Past limits.max_response_bytes: paid for, cut here, and
				// never called again (before the first token, Classify
				// ends the job the same way).
				return resp, nil, &streamEnd{status: job.StatusFailed, reason: "too_large", tr: tr, err: err}
			}
			if !tr.Started() {
				var se *provider.StreamError
				if errors.As(err, &se) {
					// An error event before any output: classified as the
					// server error it reports.
					return &provider.Response{Status: 500, Header: resp.Header, Body: se.Body, RateLimit: resp.RateLimit}, nil, nil
				}
				return resp, &provider.TransportError{Phase: provider.PhaseStreamStart, Err: broke}, nil
			}
			return resp, nil, &streamEnd{status: job.StatusInterrupted, reason: reason, tr: tr, err: broke}
		}
		var ch job.Chunk
		if json.Unmarshal(c, &ch) != nil {
			continue // not a chunk: nothing a client could read
		}
		started := tr.Started()
		tr.Add(&ch)
		if ch.UsageOnly() && !wantUsage {
			continue // Sluice asked for usage; the caller did not
		}
		switch {
		case tr.Started() && !started:
			ttft := s.now().Sub(start)
			s.m.TimeToFirstToken.WithLabelValues(labels...).Observe(ttft.Seconds())
			s.fin.firstToken.Store(j.Key(), ttft)
			first.Store(true)
			timer.Reset(cfg.IdleTimeout.D())
			pub.add(append(held, c)...)
			held = nil
		case started:
			timer.Reset(cfg.IdleTimeout.D())
			pub.add(c)
		default:
			held = append(held, c)
		}
	}
}

// streamBreak names why a stream broke and the error to report.
func streamBreak(err, cause error) (reason string, broke error) {
	var se *provider.StreamError
	switch {
	case errors.Is(cause, provider.ErrFirstTokenTimeout):
		return "first_token_timeout", provider.ErrFirstTokenTimeout
	case errors.Is(cause, provider.ErrIdleTimeout):
		return "idle_timeout", provider.ErrIdleTimeout
	case errors.Is(cause, context.DeadlineExceeded):
		return "total_timeout", fmt.Errorf("the call's timeout passed: %w", context.DeadlineExceeded)
	case errors.As(err, &se):
		return "error_event", err
	}
	return "cut", err
}

// endStream ends a streamed job that got past its first token (or ended
// cleanly or was cancelled): the last stream message, then the result
// with the text received and the usage known. Usage the provider
// reported settles the budget; a stream cut before its usage chunk stays
// charged its reservation.
func (s *streamer) endStream(ctx context.Context, j *task.Task, opKey string, pub *chunkPublisher, e *streamEnd) error {
	r := &mesh.Outcome{Status: e.status, Usage: e.tr.Usage()}
	if r.Usage == nil && e.tr.Started() {
		r.Usage, r.UsageSource = s.estimateUsage(j, e.tr), job.UsageEstimate
	}
	if e.tr.Started() || e.status == job.StatusSucceeded {
		r.Response = e.tr.Completion()
	}
	switch {
	case e.endErr != nil: // as an earlier attempt ended it
		r.Error = e.endErr
		if e.endErr.Code == job.CodeResponseTooLarge {
			r.Response = nil
		}
	case e.status == job.StatusFailed: // too_large: what was received is not stored either
		s.m.StreamInterrupted.WithLabelValues(j.Provider, j.Model, e.reason).Inc()
		r.Response, r.Error = nil, s.fin.tooLarge()
	case e.status == job.StatusInterrupted && e.reason == "executor_lost":
		s.m.StreamInterrupted.WithLabelValues(j.Provider, j.Model, e.reason).Inc()
		r.Error = &job.Error{Code: job.CodeStreamInterrupted, Message: "the executor streaming this job was lost after the first token: the text relayed is in the response; not called again, since that would repeat text already delivered and pay twice"}
	case e.status == job.StatusInterrupted:
		s.m.StreamInterrupted.WithLabelValues(j.Provider, j.Model, e.reason).Inc()
		r.Error = &job.Error{Code: job.CodeStreamInterrupted, Message: fmt.Sprintf(
			"the provider's stream broke after the first token (%s): the text received is in the response; not retried, since that would repeat text already delivered and pay twice", e.reason)}
	case e.status == job.StatusCancelled:
		s.m.StreamInterrupted.WithLabelValues(j.Provider, j.Model, "cancelled").Inc()
		r.Error = &job.Error{Code: job.CodeCancelled, Message: "the caller went away; the provider call was stopped"}
	}
	if len(r.Response) > s.app().Limits.MaxResponseBytes {
		// The stream's end must say what the result will: finish would
		// store this as response_too_large.
		r.Status, r.Response, r.Error = job.StatusFailed, nil, s.fin.tooLarge()
	}
	if u := e.tr.Usage(); u != nil && !e.unsettled {
		s.fb.settle(ctx, j, *u)
	}
	pub.end(r.Status, r.Error)
	s.fin.ended.Store(j.Key(), true)
	return s.fin.finish(ctx, j, opKey, r)
}

// chunkPublisher publishes a job's chunks to its stream subject, batched:
// the first at once, then at most every interval (the flush interval), so
// a reader gets tokens as they come at a few messages per second rather
// than one per token.
type chunkPublisher struct {
	js       jetstream.JetStream
	subject  string
	tenant   string
	jobID    string
	interval time.Duration
	now      func() time.Time
	onErr    func(error)

	mu      sync.Mutex
	pending []json.RawMessage
	size    int
	last    time.Time
	timer   *time.Timer
	seq     int
	ended   bool
}

// maxBatchBytes flushes a batch early, well under STREAMS' message size.
const maxBatchBytes = 256 << 10

func newChunkPublisher(js jetstream.JetStream, j *task.Task, interval time.Duration, now func() time.Time, onErr func(error)) *chunkPublisher {
	return &chunkPublisher{js: js, subject: job.StreamSubject(j.Tenant, j.ID), tenant: j.Tenant, jobID: j.ID, interval: interval, now: now, onErr: onErr}
}

func (p *chunkPublisher) add(chunks ...json.RawMessage) {
	if len(chunks) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	for _, c := range chunks {
		p.pending = append(p.pending, c)
		p.size += len(c)
	}
	if wait := p.interval - p.now().Sub(p.last); wait <= 0 || p.size >= maxBatchBytes {
		p.flushLocked("", nil)
	} else if p.timer == nil {
		p.timer = time.AfterFunc(wait, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.timer = nil
			if !p.ended && len(p.pending) > 0 {
				p.flushLocked("", nil)
			}
		})
	}
}

// end publishes what is pending with the stream's end marker.
func (p *chunkPublisher) end(status job.Status, e *job.Error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.flushLocked(status, e)
	p.ended = true
}

func (p *chunkPublisher) flushLocked(end job.Status, e *job.Error) {
	p.seq++
	data, _ := json.Marshal(job.StreamMessage{Chunks: p.pending, End: end, Error: e})
	p.pending, p.size, p.last = nil, 0, p.now()
	msg := nats.NewMsg(p.subject)
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, keys.MsgID(keys.MsgChunk, p.tenant, p.jobID, strconv.Itoa(p.seq)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.js.PublishMsg(ctx, msg); err != nil && p.onErr != nil {
		p.onErr(err)
	}
}

// cancelBeforeCall ends a streamed job whose caller went away before its
// provider call: nothing is sent, and the reservation's tokens go back to
// the window (the request it reserved stays spent: its slot has passed).
func (s *streamer) cancelBeforeCall(ctx context.Context, j *task.Task, opKey string) error {
	ctx = context.WithoutCancel(ctx)
	s.fb.returnUnusedTokens(ctx, j)
	s.m.StreamInterrupted.WithLabelValues(j.Provider, j.Model, "cancelled").Inc()
	e := &job.Error{Code: job.CodeCancelled, Message: "the caller went away before the provider was called"}
	return s.fin.finish(ctx, j, opKey, &mesh.Outcome{Status: job.StatusCancelled, Error: e})
}

// estimateUsage is Sluice's estimate of what a stream that ended without
// the provider's usage (cut before its usage chunk) used: the prompt as
// estimated at intake and the completion's text as received, counted.
func (s *streamer) estimateUsage(j *task.Task, tr *job.Transcript) *job.Usage {
	u := &job.Usage{CompletionTokens: tokens.Count(j.Model, string(tr.Completion()))}
	if j.Estimate != nil {
		u.PromptTokens = j.Estimate.PromptTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}
