package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// resumeReadWait bounds reading a job's chunks back from STREAMS.
const resumeReadWait = 5 * time.Second

// streamedBefore is what STREAMS holds of a job an earlier attempt
// streamed: its chunks in order, the end marker if it was published, and
// the last publish's sequence in the job's message ids.
type streamedBefore struct {
	chunks []json.RawMessage
	end    *job.StreamMessage // nil: the stream never ended
	seq    int
}

// readStreamed reads back what STREAMS holds for job j; nil if nothing.
func (s *streamer) readStreamed(ctx context.Context, j *task.Task) (*streamedBefore, error) {
	ctx, cancel := context.WithTimeout(ctx, resumeReadWait)
	defer cancel()
	subject := job.StreamSubject(j.Tenant, j.ID)
	st, err := s.mesh.JS.Stream(ctx, streams.StreamChunks)
	if err != nil {
		return nil, err
	}
	if _, err := st.GetLastMsgForSubject(ctx, subject); errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, err
	}
	out := &streamedBefore{}
	for {
		m, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", subject, err)
		}
		// What STREAMS holds is input like any message: one that is not a
		// stream message is skipped (as relays skip it), an end that is
		// not a terminal status is no end.
		var sm job.StreamMessage
		if err := json.Unmarshal(m.Data(), &sm); err != nil {
			s.log.Warn("skipping a malformed message on a job's stream subject", "job_id", j.ID)
		} else {
			out.chunks = append(out.chunks, sm.Chunks...)
			if sm.End.Terminal() {
				out.end = &sm
			}
		}
		if id := m.Headers().Get(jetstream.MsgIDHeader); id != "" {
			if n, err := strconv.Atoi(keys.MsgSeq(id)); err == nil {
				out.seq = max(out.seq, n)
			}
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, err
		}
		if md.NumPending == 0 {
			return out, nil
		}
	}
}

// resumeStream ends a streamed job whose earlier attempt got past its first
// token and then lost its executor (a crash, a kill): STREAMS holds what it
// relayed, and the operation record is still in flight. Calling again would
// pay a second time and, on the job's subject, follow the text already
// relayed with a second answer. Instead the job ends from what STREAMS
// holds: as the earlier attempt ended it, if its end marker was published
// (it died before storing the result), otherwise interrupted
// (executor_lost) with the text relayed. The reservation this attempt
// holds was never used: its tokens go back. It reports whether the job
// ended here; with nothing in STREAMS (the earlier attempt relayed no
// token, or STREAMS no longer keeps it) the call goes ahead as any retry.
func (s *streamer) resumeStream(ctx context.Context, j *task.Task, opKey string) (bool, error) {
	before, err := s.readStreamed(ctx, j)
	if err != nil {
		// Not knowing what was relayed is no reason to pay twice; the
		// job comes back by redelivery.
		return true, fmt.Errorf("resume stream: %w", err)
	}
	if before == nil {
		return false, nil
	}
	s.fb.returnUnusedTokens(ctx, j)
	tr := &job.Transcript{}
	for _, c := range before.chunks {
		var ch job.Chunk
		if json.Unmarshal(c, &ch) == nil {
			tr.Add(&ch)
		}
	}
	pub := newChunkPublisher(s.mesh.JS, j, 0, s.now, nil)
	pub.seq = before.seq
	e := &streamEnd{status: job.StatusInterrupted, reason: "executor_lost", tr: tr, unsettled: true}
	if end := before.end; end != nil {
		pub.ended = true // the relays have their end already
		e.status, e.reason, e.endErr = end.End, "", end.Error
		if e.endErr == nil && e.status != job.StatusSucceeded {
			e.endErr = &job.Error{Code: string(e.status), Message: "the job's stream ended " + string(e.status)}
		}
	}
	s.log.Warn("a streamed job's executor was lost after its first token; ending it from what was relayed, without calling again",
		"job_id", j.ID, "chunks", len(before.chunks), "end", string(e.status))
	return true, s.endStream(ctx, j, opKey, pub, e)
}
