package ingest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/ssestream"
)

// readAnthropic decodes an event stream with Anthropic's SDK and folds it
// into a message, as an SDK user's stream.Next/Accumulate loop does.
func readAnthropic(t *testing.T, events []byte) (anthropic.Message, []string, error) {
	t.Helper()
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(bytes.NewReader(events))}
	st := ssestream.NewStream[anthropic.MessageStreamEventUnion](ssestream.NewDecoder(resp), nil)
	var msg anthropic.Message
	var types []string
	for st.Next() {
		ev := st.Current()
		types = append(types, ev.Type)
		if err := msg.Accumulate(ev); err != nil {
			t.Fatalf("accumulating %s: %v", ev.Type, err)
		}
	}
	return msg, types, st.Err()
}

// TestAnthropicEvents: OpenAI chunks (text, then two tool calls, the finish
// and the usage chunk) become the Messages stream that Anthropic's SDK
// accumulates into the same message a non-streamed call returns.
func TestAnthropicEvents(t *testing.T) {
	t.Parallel()
	chunks := []string{
		`{"id":"chatcmpl-abc","model":"m-2024","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"id":"chatcmpl-abc","choices":[{"index":0,"delta":{"content":"Hel"}}]}`,
		`{"id":"chatcmpl-abc","choices":[{"index":0,"delta":{"content":"lo"}}]}`,
		`{"id":"chatcmpl-abc","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`,
		`{"id":"chatcmpl-abc","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`,
		`{"id":"chatcmpl-abc","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}`,
		`{"id":"chatcmpl-abc","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]}}]}`,
		`{"id":"chatcmpl-abc","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"id":"chatcmpl-abc","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":12,"prompt_tokens_details":{"cached_tokens":10}}}`,
	}
	var buf bytes.Buffer
	a := newAnthropicEvents("m")
	if !a.keepAlive(&buf) {
		t.Fatal("keep-alive not written")
	}
	for _, c := range chunks {
		if !a.chunk(&buf, []byte(c)) {
			t.Fatal("chunk not written")
		}
	}
	if !a.done(&buf) {
		t.Fatal("end not written")
	}
	msg, types, err := readAnthropic(t, buf.Bytes())
	if err != nil {
		t.Fatalf("the SDK refused the stream: %v\n%s", err, buf.String())
	}
	want := []string{"message_start",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_stop",
		"message_delta", "message_stop"}
	if strings.Join(types, " ") != strings.Join(want, " ") {
		t.Errorf("events %v\nwant   %v", types, want)
	}
	if msg.ID != "msg_abc" || msg.Model != "m-2024" || msg.Role != "assistant" || msg.StopReason != anthropic.StopReasonToolUse {
		t.Errorf("message id %q model %q role %q stop %q", msg.ID, msg.Model, msg.Role, msg.StopReason)
	}
	if len(msg.Content) != 3 || msg.Content[0].Text != "Hello" ||
		msg.Content[1].Name != "get_weather" || msg.Content[1].ID != "call_1" || string(msg.Content[1].Input) != `{"city":"Paris"}` ||
		msg.Content[2].Name != "get_time" || string(msg.Content[2].Input) != `{}` {
		b, _ := json.Marshal(msg.Content)
		t.Errorf("content %s", b)
	}
	if u := msg.Usage; u.InputTokens != 20 || u.CacheReadInputTokens != 10 || u.OutputTokens != 12 {
		t.Errorf("usage %+v, want 20 input, 10 read from the cache, 12 output", u)
	}
	if !strings.HasPrefix(buf.String(), "event: ping\n") {
		t.Errorf("keep-alive is not a ping event: %q", buf.String()[:min(buf.Len(), 40)])
	}
}

// TestAnthropicEventsError: a job that fails mid-stream ends the stream
// with an error event the SDK returns as an error of Anthropic's type.
func TestAnthropicEventsError(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	a := newAnthropicEvents("m")
	a.chunk(&buf, []byte(`{"id":"chatcmpl-x","choices":[{"index":0,"delta":{"content":"Hi"}}]}`))
	a.fail(&buf, "sluice_expired", "expired", "the job's deadline passed", failureStatus("expired", "expired"), "req_1")
	msg, _, err := readAnthropic(t, buf.Bytes())
	if err == nil {
		t.Fatalf("no error from a failed stream; message %+v", msg)
	}
	if !strings.Contains(err.Error(), "timeout_error") || !strings.Contains(err.Error(), "the job's deadline passed") {
		t.Errorf("error %q, want timeout_error and the message", err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Text != "Hi" {
		t.Errorf("content before the error %+v, want the text so far", msg.Content)
	}
}
