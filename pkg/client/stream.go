package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// StreamError ends a stream that did not succeed: the job's terminal
// status (interrupted, cancelled, failed, expired, dead_lettered) and why.
// After an interrupted stream the job's result holds the text received.
type StreamError struct {
	JobID  string
	Status job.Status
	Err    *job.Error
}

func (e *StreamError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("sluice: job %s ended %s", e.JobID, e.Status)
	}
	return fmt.Sprintf("sluice: job %s ended %s: %s", e.JobID, e.Status, e.Err)
}

// Stream submits j as a streamed job (its request gets stream: true) and
// returns its chunks as they come: OpenAI chat.completion.chunk objects,
// the usage chunk last when the request asks for it with
// stream_options.include_usage. A stream that does not succeed ends with a
// *StreamError.
//
//	for chunk, err := range c.Stream(ctx, &job.Job{Tenant: "acme", Request: body}) {
//		if err != nil {
//			return err
//		}
//		fmt.Print(chunk.Text())
//	}
func (c *Client) Stream(ctx context.Context, j *job.Job) iter.Seq2[*job.Chunk, error] {
	return func(yield func(*job.Chunk, error) bool) {
		j.Request = job.WithMember(j.Request, "stream", json.RawMessage("true"))
		req, err := job.ParseRequest(j.Request, job.Limits{})
		if err != nil {
			yield(nil, err)
			return
		}
		// Watch the stream and result subjects before the job exists, so
		// nothing published can be missed: a tenant's connection may not
		// read JetStream, and a refusal of a job that never had a record is
		// published, not stored.
		msgs, id, err := c.followLive(ctx, j, req.WantsUsage())
		if err != nil {
			yield(nil, err)
			return
		}
		for m, err := range msgs {
			if err != nil {
				yield(nil, err)
				return
			}
			for _, raw := range m.Chunks {
				var ch job.Chunk
				if err := json.Unmarshal(raw, &ch); err != nil {
					yield(nil, fmt.Errorf("sluice: chunk of job %s: %w", id, err))
					return
				}
				if !yield(&ch, nil) {
					return
				}
			}
			if m.End != "" && m.End != job.StatusSucceeded {
				yield(nil, &StreamError{JobID: id, Status: m.End, Err: m.Error})
				return
			}
		}
	}
}

// followLive subscribes to j's stream and result subjects (core NATS, as
// a tenant's connection may), then submits j. Its stream is read as it is
// published, in order; a job that ends without a streamed answer is
// rendered from its result.
func (c *Client) followLive(ctx context.Context, j *job.Job, usage bool) (iter.Seq2[*job.StreamMessage, error], string, error) {
	if !job.ValidName(j.Tenant) {
		return nil, "", fmt.Errorf("sluice: tenant %q is not a valid name", j.Tenant)
	}
	if j.ID == "" {
		j.ID = job.NewID()
	}
	chunks := make(chan *nats.Msg, 256)
	results := make(chan *nats.Msg, 1)
	csub, err := c.nc.ChanSubscribe(job.StreamSubject(j.Tenant, j.ID), chunks)
	if err != nil {
		return nil, "", fmt.Errorf("sluice: subscribe stream: %w", err)
	}
	rsub, err := c.nc.ChanSubscribe(job.ResultSubject(j.Tenant, j.ID), results)
	if err != nil {
		_ = csub.Unsubscribe()
		return nil, "", fmt.Errorf("sluice: subscribe result: %w", err)
	}
	_ = csub.SetPendingLimits(-1, 64<<20)
	stop := func() { _ = csub.Unsubscribe(); _ = rsub.Unsubscribe() }
	id, err := c.Submit(ctx, j)
	if err != nil {
		stop()
		return nil, "", err
	}
	return func(yield func(*job.StreamMessage, error) bool) {
		defer stop()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // ends the forwarder below
		data := make(chan []byte)
		go func() {
			for {
				select {
				case m := <-chunks:
					select {
					case data <- m.Data:
					case <-ctx.Done():
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
		relay(ctx, id, usage, data, results, nil, func() bool { return len(chunks) > 0 }, yield)
	}, id, nil
}

// resultGrace is how long Follow waits, once the job's result is in, for
// the end of a stream that published chunks (the end marker is published
// before the result, so it only waits when that publish failed).
const resultGrace = 2 * time.Second

// Follow reads a job's stream subject (sluice.stream.<tenant>.<id>) from
// its start, in order, with an ordered consumer of the STREAMS stream: a
// reader that joins late or reconnects misses nothing the stream still
// holds (streaming.replay, 5 minutes by default). It yields each message;
// the last has End set. A job that ends without a streamed answer (refused,
// expired, not streamed) yields one message made from its result (a
// succeeded answer as chunks, with the usage chunk if usage). It stops at
// the end, when ctx ends, or when the caller stops iterating.
func Follow(ctx context.Context, js jetstream.JetStream, tenant, id string, usage bool) iter.Seq2[*job.StreamMessage, error] {
	return func(yield func(*job.StreamMessage, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		results := make(chan *nats.Msg, 1)
		sub, err := js.Conn().ChanSubscribe(job.ResultSubject(tenant, id), results)
		if err != nil {
			yield(nil, fmt.Errorf("sluice: subscribe result: %w", err))
			return
		}
		defer func() { _ = sub.Unsubscribe() }()
		cons, err := js.OrderedConsumer(ctx, "STREAMS", jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{job.StreamSubject(tenant, id)}, DeliverPolicy: jetstream.DeliverAllPolicy})
		if err != nil {
			yield(nil, fmt.Errorf("sluice: follow stream: %w", err))
			return
		}
		msgs := make(chan []byte, 64)
		cc, err := cons.Consume(func(m jetstream.Msg) {
			select {
			case msgs <- m.Data():
			case <-ctx.Done():
			}
		})
		if err != nil {
			yield(nil, fmt.Errorf("sluice: follow stream: %w", err))
			return
		}
		defer cc.Stop()

		var res *job.Result
		if r, err := storedResult(ctx, js, tenant, id); err == nil {
			res = r
		}
		relay(ctx, id, usage, msgs, results, res, func() bool { return hasChunks(ctx, js, tenant, id) }, yield)
	}
}

// relay yields a job's stream messages (chunks, as published) until its
// end marker. When its result arrives (res, if already stored) and nothing
// was streamed (pending reports whether chunks are on their way), the
// result is rendered as the stream; otherwise the end marker is waited
// for, at most resultGrace.
func relay(ctx context.Context, id string, usage bool, chunks <-chan []byte, results <-chan *nats.Msg, res *job.Result, pending func() bool, yield func(*job.StreamMessage, error) bool) {
	seen := false
	var grace <-chan time.Time
	// onResult reports whether to go on reading the stream.
	onResult := func() bool {
		if seen || pending() {
			grace = time.After(resultGrace)
			return true
		}
		// Nothing was streamed (the end marker is published before the
		// result): the result says how the job ended.
		yield(resultMessage(res, usage), nil)
		return false
	}
	if res != nil && !onResult() {
		return
	}
	for {
		select {
		case data := <-chunks:
			seen = true
			var sm job.StreamMessage
			if err := json.Unmarshal(data, &sm); err != nil {
				yield(nil, fmt.Errorf("sluice: stream message of job %s: %w", id, err))
				return
			}
			if !yield(&sm, nil) || sm.End != "" {
				return
			}
		case m := <-results:
			if res != nil {
				continue
			}
			var r job.Result
			if err := json.Unmarshal(m.Data, &r); err != nil {
				yield(nil, fmt.Errorf("sluice: result %s: %w", id, err))
				return
			}
			res = &r
			if !onResult() {
				return
			}
		case <-grace:
			yield(resultMessage(res, usage), nil)
			return
		case <-ctx.Done():
			yield(nil, ctx.Err())
			return
		}
	}
}

// resultMessage renders a result as a stream's last message.
func resultMessage(r *job.Result, usage bool) *job.StreamMessage {
	m := &job.StreamMessage{End: r.Status, Error: r.Error}
	if r.Status == job.StatusSucceeded || r.Status == job.StatusInterrupted || r.Status == job.StatusCancelled {
		m.Chunks = job.CompletionChunks(r.Response, usage)
	}
	if r.Status != job.StatusSucceeded && m.Error == nil {
		m.Error = &job.Error{Code: string(r.Status), Message: "the job did not succeed"}
	}
	return m
}

func storedResult(ctx context.Context, js jetstream.JetStream, tenant, id string) (*job.Result, error) {
	st, err := js.Stream(ctx, streams.Results)
	if err != nil {
		return nil, err
	}
	m, err := st.GetLastMsgForSubject(ctx, job.StoreSubject(tenant, id))
	if err != nil {
		return nil, err
	}
	var r job.Result
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// hasChunks reports whether STREAMS holds anything of the job's stream.
func hasChunks(ctx context.Context, js jetstream.JetStream, tenant, id string) bool {
	st, err := js.Stream(ctx, streams.StreamChunks)
	if err != nil {
		return false
	}
	_, err = st.GetLastMsgForSubject(ctx, job.StreamSubject(tenant, id))
	return err == nil || !errors.Is(err, jetstream.ErrMsgNotFound)
}
