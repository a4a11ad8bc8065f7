package provider_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// drain reads a stream to its end, assembling the chunks.
func drain(t *testing.T, st *provider.Stream) (*job.Transcript, int, error) {
	t.Helper()
	var tr job.Transcript
	n := 0
	for {
		c, err := st.Next()
		if err != nil {
			return &tr, n, err
		}
		var ch job.Chunk
		if err := json.Unmarshal(c, &ch); err != nil {
			t.Fatalf("chunk %s: %v", c, err)
		}
		tr.Add(&ch)
		n++
	}
}

func TestOpenAIStream(t *testing.T) {
	t.Parallel()
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: "m"}}, Faults: sim.Faults{RateStreamCut: 1, StreamCutAfter: 2, MaxFaults: 1}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	defer srv.Close()
	c := provider.NewOpenAI(provider.OpenAIConfig{BaseURL: srv.URL + "/v1"})
	body := []byte(`{"model":"m","max_tokens":20,"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`)

	// The first call is cut after two tokens: an error, not a clean end.
	_, st, err := c.Stream(context.Background(), provider.Call{Body: body})
	if err != nil {
		t.Fatal(err)
	}
	tr, _, err := drain(t, st)
	st.Close()
	if err == nil || errors.Is(err, io.EOF) {
		t.Errorf("cut stream ended with %v, want an error", err)
	}
	if got := len(strings.Fields(tr.Text())); got != 2 {
		t.Errorf("cut stream gave %d words, want 2", got)
	}

	resp, st, err := c.Stream(context.Background(), provider.Call{Body: body})
	if err != nil || resp.Status != 200 {
		t.Fatalf("status %v, err %v", resp, err)
	}
	tr, _, err = drain(t, st)
	st.Close()
	if !errors.Is(err, io.EOF) {
		t.Fatalf("stream ended with %v, want io.EOF", err)
	}
	if u := tr.Usage(); u == nil || u.CompletionTokens != len(strings.Fields(tr.Text())) {
		t.Errorf("usage %+v for %d words", u, len(strings.Fields(tr.Text())))
	}

	// An error status is a Response for Classify, with no stream.
	resp, st, err = c.Stream(context.Background(), provider.Call{Body: []byte(`{"model":"nope","messages":[{"role":"user","content":"hi"}],"stream":true}`)})
	if err != nil || st != nil || resp.Status != 404 {
		t.Errorf("unknown model: %+v, stream %v, err %v; want a 404 response", resp, st, err)
	}
}

// anthropicEvents is a Messages API stream with text, a tool call, usage
// in message_start and message_delta, and a ping.
const anthropicEvents = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,"usage":{"input_tokens":12,"cache_read_input_tokens":3,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type":"ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" there"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"get","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"1}"}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}}

`

func TestAnthropicStream(t *testing.T) {
	t.Parallel()
	var sent map[string]any
	for _, tc := range []struct {
		name, tail string
		wantErr    func(error) bool
	}{
		{"complete", "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", func(err error) bool { return errors.Is(err, io.EOF) }},
		{"cut", "", func(err error) bool { return errors.Is(err, provider.ErrStreamCut) }},
		{"error event", "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n", func(err error) bool {
			var se *provider.StreamError
			return errors.As(err, &se) && provider.Classify(&provider.Response{Status: 500, Body: se.Body}, nil, time.Now()).Code == "overloaded_error"
		}},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewDecoder(r.Body).Decode(&sent)
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, anthropicEvents+tc.tail)
		}))
		c := provider.NewAnthropic(provider.AnthropicConfig{BaseURL: srv.URL})
		_, st, err := c.Stream(context.Background(), provider.Call{Model: "claude-x",
			Body: []byte(`{"model":"claude-x","max_tokens":50,"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`)})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		tr, _, err := drain(t, st)
		st.Close()
		srv.Close()
		if !tc.wantErr(err) {
			t.Errorf("%s: ended with %v", tc.name, err)
		}
		if sent["stream"] != true || sent["stream_options"] != nil {
			t.Errorf("%s: sent stream %v, stream_options %v; want true and none", tc.name, sent["stream"], sent["stream_options"])
		}
		if tr.Text() != "Hello there" {
			t.Errorf("%s: text %q", tc.name, tr.Text())
		}
		body := string(tr.Completion())
		if !strings.Contains(body, `"arguments":"{\"a\":1}"`) || !strings.Contains(body, `"finish_reason":"tool_calls"`) {
			t.Errorf("%s: completion %s", tc.name, body)
		}
		if u := tr.Usage(); u == nil || u.PromptTokens != 15 || u.CompletionTokens != 9 || u.CachedTokens != 3 {
			t.Errorf("%s: usage %+v, want 15 prompt (3 cached), 9 completion", tc.name, u)
		}
	}
}

// TestStreamCapped: a stream is held to MaxResponseBytes as a whole body
// is. An upstream that streams on and on (here up to 4 MiB of 1 KiB chunks)
// is cut at the cap with ErrBodyTooLarge, having delivered no more than
// the cap, and the client stops reading.
func TestStreamCapped(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	stopped := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 1000) + `"}}]}` + "\n\n"
		sent := 0
		for sent < 4<<20 {
			if _, err := io.WriteString(w, chunk); err != nil {
				break
			}
			sent += len(chunk)
			w.(http.Flusher).Flush()
		}
		stopped <- sent
	}))
	defer srv.Close()
	for _, c := range []provider.Streamer{
		provider.NewOpenAI(provider.OpenAIConfig{BaseURL: srv.URL + "/v1", MaxResponseBytes: limit}),
	} {
		_, st, err := c.Stream(context.Background(), provider.Call{Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)})
		if err != nil {
			t.Fatal(err)
		}
		tr, n, err := drain(t, st)
		st.Close()
		var te *provider.TransportError
		if !errors.As(err, &te) || te.Phase != provider.PhaseBody || !errors.Is(err, provider.ErrBodyTooLarge) {
			t.Fatalf("after %d chunks: %v, want a body-phase ErrBodyTooLarge", n, err)
		}
		if got := len(tr.Text()); got > limit || got < limit/2 {
			t.Errorf("delivered %d bytes of text, want up to the %d-byte cap", got, limit)
		}
		if sent := <-stopped; sent >= 4<<20 {
			t.Errorf("the upstream wrote all %d bytes: the client kept reading past the cap", sent)
		}
	}
}
