package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Streamer is a Client that can also stream a call's answer.
//
// Stream sends c (whose Body asks for stream: true) and returns once the
// response headers are in. A non-2xx answer comes back as a Response with
// its body read in full and a nil *Stream, for Classify, exactly as Do
// returns it. A 2xx answer comes back as a Response without a body and a
// *Stream of OpenAI chat.completion.chunk objects. The error, as Do's, is
// a *TransportError: the call never got headers.
type Streamer interface {
	Stream(ctx context.Context, c Call) (*Response, *Stream, error)
}

// ErrStreamCut is returned by Stream.Next when the provider's stream ends
// without its end marker (OpenAI's data: [DONE], Anthropic's
// message_stop): a connection closed mid-answer, which a plain SSE reader
// takes for a clean end.
var ErrStreamCut = errors.New("stream ended without its end marker")

// StreamError is an error event inside a stream (OpenAI's data:
// {"error": ...}, Anthropic's event: error). Body is the error in OpenAI's
// shape, for Classify.
type StreamError struct{ Body []byte }

func (e *StreamError) Error() string {
	ei := parseErrorBody(e.Body)
	return "provider error event: " + firstNonEmpty(ei.code, ei.typ, "error") + ": " + cleanMessage(ei.msg)
}

// Stream reads a streamed answer. Next is not safe for concurrent use;
// end a stream early by cancelling the context of the call that opened
// it, and always Close it.
type Stream struct {
	body    io.Closer
	dec     ssestream.Decoder
	pending [][]byte
	conv    func(ev ssestream.Event) (chunks [][]byte, done bool, err error)
	done    bool
	err     error
}

// Next returns the next chunk (an OpenAI chat.completion.chunk, JSON). It
// returns io.EOF after the provider's end marker, ErrStreamCut when the
// stream ends without one, a *StreamError for an error event, and a
// *TransportError (PhaseBody) when reading fails; the first error stays.
func (s *Stream) Next() ([]byte, error) {
	for {
		if len(s.pending) > 0 {
			c := s.pending[0]
			s.pending = s.pending[1:]
			return c, nil
		}
		if s.err != nil {
			return nil, s.err
		}
		if s.done {
			s.err = io.EOF
			return nil, s.err
		}
		if s.dec == nil || !s.dec.Next() {
			s.err = ErrStreamCut
			if s.dec != nil && s.dec.Err() != nil {
				s.err = &TransportError{Phase: PhaseBody, Err: s.dec.Err()}
			}
			continue
		}
		ev := s.dec.Event()
		ev.Data = bytes.TrimSpace(ev.Data)
		chunks, done, err := s.conv(ev)
		s.pending = append(s.pending, chunks...)
		s.done = done
		if err != nil {
			s.err = err
		}
	}
}

// Close releases the connection.
func (s *Stream) Close() error {
	if s.body == nil {
		return nil
	}
	return s.body.Close()
}

// openStream POSTs a streamed call. A non-2xx answer is read in full; a
// 2xx answer that is not an event stream (a server that ignored stream:
// true) is read in full and handed to whole, which returns its chunks.
func openStream(ctx context.Context, rt http.RoundTripper, target string, body []byte, h http.Header, maxResp int,
	conv func(ssestream.Event) ([][]byte, bool, error), whole func([]byte) [][]byte) (*Response, *Stream, error) {
	h.Set("Accept", "text/event-stream")
	resp, err := open(ctx, rt, target, body, h)
	if err != nil {
		return nil, nil, err
	}
	r := &Response{Status: resp.StatusCode, Header: resp.Header, RateLimit: ParseRateLimit(resp.Header, time.Now())}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if resp.StatusCode < 200 || resp.StatusCode > 299 || mt != "text/event-stream" {
		defer resp.Body.Close()
		b, err := readBody(ctx, resp, maxResp)
		if err != nil {
			return nil, nil, err
		}
		r.Body = b
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			return r, nil, nil
		}
		return r, &Stream{pending: whole(b), done: true}, nil
	}
	// The cap holds for a stream as for a whole body: an answer that
	// streams past it (a runaway provider, one huge event) stops there,
	// a PhaseBody error with ErrBodyTooLarge, with at most the cap held.
	if maxResp <= 0 {
		maxResp = MaxBodyBytes
	}
	resp.Body = &cappedBody{ReadCloser: resp.Body, left: int64(maxResp)}
	return r, &Stream{body: resp.Body, dec: ssestream.NewDecoder(resp), conv: conv}, nil
}

// cappedBody fails its reads with ErrBodyTooLarge once more than its cap
// has been read.
type cappedBody struct {
	io.ReadCloser
	left int64
}

func (c *cappedBody) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, ErrBodyTooLarge
	}
	n, err := c.ReadCloser.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return n, ErrBodyTooLarge
	}
	return n, err
}

// Stream POSTs c.Body (which asks for stream: true), untouched, to
// {BaseURL}/chat/completions and reads OpenAI's chunks.
func (o *OpenAI) Stream(ctx context.Context, c Call) (*Response, *Stream, error) {
	if o.native && c.Endpoint == job.EndpointResponses {
		return o.streamResponses(ctx, c)
	}
	ctx = withSendBy(ctx, c)
	target, err := endpoint(o.baseURL, "/chat/completions")
	if err != nil {
		return nil, nil, buildErr("%v", err)
	}
	h := baseHeader(c)
	if o.apiKey != "" {
		h.Set("Authorization", "Bearer "+o.apiKey)
	}
	body, err := forChat(c)
	if err != nil {
		return nil, nil, err
	}
	return openStream(ctx, o.rt, target, body, h, o.maxResp, openAIEvent, func(b []byte) [][]byte { return raw(job.CompletionChunks(b, true)) })
}

func raw(in []json.RawMessage) [][]byte {
	out := make([][]byte, len(in))
	for i, c := range in {
		out[i] = c
	}
	return out
}

// openAIEvent reads one OpenAI stream event: a chunk, [DONE], or an
// error object.
func openAIEvent(ev ssestream.Event) ([][]byte, bool, error) {
	if bytes.Equal(ev.Data, []byte("[DONE]")) {
		return nil, true, nil
	}
	var probe struct {
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(ev.Data, &probe); err != nil {
		return nil, false, &StreamError{Body: []byte(`{"error":{"message":"undecodable stream event","type":"server_error"}}`)}
	}
	if len(probe.Error) > 0 && string(probe.Error) != "null" {
		return nil, false, &StreamError{Body: append([]byte(nil), ev.Data...)}
	}
	return [][]byte{append([]byte(nil), ev.Data...)}, false, nil
}

// Stream converts c.Body to a streamed Messages API body, POSTs it to
// {BaseURL}/messages and translates Anthropic's events (message_start,
// content_block_start/delta, message_delta with the usage, message_stop,
// error) into OpenAI chunks: a role chunk, content and tool-call deltas, a
// finish chunk and a usage chunk (always; the caller drops it when its
// client did not ask for usage).
func (a *Anthropic) Stream(ctx context.Context, c Call) (*Response, *Stream, error) {
	ctx = withSendBy(ctx, c)
	target, err := endpoint(a.baseURL, "/messages")
	if err != nil {
		return nil, nil, buildErr("%v", err)
	}
	body, err := wire.ChatToAnthropic(job.WithoutMembers(c.Body, "stream", "stream_options"), c.Model)
	if err != nil {
		return nil, nil, buildErr("converting request for the Messages API: %v", err)
	}
	body = job.WithMember(body, "stream", json.RawMessage("true"))
	h := baseHeader(c)
	h.Set("X-Api-Key", a.apiKey)
	h.Set("Anthropic-Version", a.version)
	tr := wire.NewAnthropicChunks(time.Now().Unix())
	r, st, err := openStream(ctx, a.rt, target, body, h, a.maxResp, anthropicEvent(tr), func(b []byte) [][]byte {
		conv, _, err := wire.AnthropicToChat(b, time.Now())
		if err != nil {
			return nil
		}
		return raw(job.CompletionChunks(conv, true))
	})
	if r != nil && st == nil {
		if conv, ok := wire.AnthropicErrorToOpenAI(r.Body); ok {
			r.Body = conv
		}
	}
	return r, st, err
}

// anthropicEvent is the stream's event function over the translation
// (wire.AnthropicChunks): an error event ends the stream with its body.
func anthropicEvent(tr *wire.AnthropicChunks) func(ev ssestream.Event) ([][]byte, bool, error) {
	return func(ev ssestream.Event) ([][]byte, bool, error) {
		chunks, done, errBody := tr.Event(ev.Type, ev.Data)
		if errBody != nil {
			return nil, false, &StreamError{Body: errBody}
		}
		return chunks, done, nil
	}
}
