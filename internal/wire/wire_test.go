package wire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestParseRequestRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ body, param string }{
		{`{"model":"m","input":"hi","background":true}`, "background"},
		{`{"model":"m","input":"hi","tools":[{"name":"f"}]}`, "tools[0].type"},
		{`{"input":"hi"}`, "model"},
		{`{"model":"m"}`, "input"},
		{`{"model":"m","input":"hi","max_output_tokens":0}`, "max_output_tokens"},
		{`{"model":"m","input":"hi","truncation":"auto"}`, "truncation"},
	} {
		_, err := ParseRequest([]byte(tc.body))
		we, ok := err.(*Error)
		if !ok || we.Param != tc.param {
			t.Errorf("%s: got %v, want an error naming %s", tc.body, err, tc.param)
		}
	}
}

func TestChatBody(t *testing.T) {
	t.Parallel()
	r, err := ParseRequest([]byte(`{"model":"m","instructions":"Be brief.","max_output_tokens":50,"temperature":0.2,
		"tools":[{"type":"function","name":"f","parameters":{"type":"object"},"strict":true}],"tool_choice":{"type":"function","name":"f"},
		"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"},"strict":true}},"stream":true,
		"input":[{"role":"developer","content":"Rules."},{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
		{"type":"reasoning","id":"rs_1","summary":[]},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]},
		{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call","call_id":"c2","name":"f","arguments":"{\"a\":1}"},
		{"type":"function_call_output","call_id":"c1","output":"one"},{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"two"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	in, err := r.InputMessages()
	if err != nil {
		t.Fatal(err)
	}
	body, err := r.ChatBody(nil, in, ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"max_tokens":50,"messages":[{"role":"system","content":"Be brief."},{"role":"system","content":"Rules."},{"role":"user","content":"ab"},` +
		`{"role":"assistant","content":"ok","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},` +
		`{"role":"tool","content":"one","tool_call_id":"c1"},{"role":"tool","content":"two","tool_call_id":"c2"}],"model":"m",` +
		`"response_format":{"json_schema":{"name":"x","schema":{"type":"object"},"strict":true},"type":"json_schema"},"stream":true,"stream_options":{"include_usage":true},` +
		`"temperature":0.2,"tool_choice":{"function":{"name":"f"},"type":"function"},"tools":[{"function":{"name":"f","parameters":{"type":"object"},"strict":true},"type":"function"}]}`
	if string(body) != want {
		t.Errorf("chat body\n got %s\nwant %s", body, want)
	}
	// And back, for a provider serving the Responses API.
	native, err := ChatToResponses(body)
	if err != nil {
		t.Fatal(err)
	}
	var n struct {
		Instructions    string            `json:"instructions"`
		Input           []json.RawMessage `json:"input"`
		MaxOutputTokens int               `json:"max_output_tokens"`
		Store           bool              `json:"store"`
		Text            json.RawMessage   `json:"text"`
		ToolChoice      json.RawMessage   `json:"tool_choice"`
	}
	if err := json.Unmarshal(native, &n); err != nil {
		t.Fatal(err)
	}
	if n.Instructions != "Be brief.\n\nRules." || len(n.Input) != 6 || n.MaxOutputTokens != 50 || n.Store ||
		string(n.ToolChoice) != `{"name":"f","type":"function"}` || !strings.Contains(string(n.Text), `"type":"json_schema"`) {
		t.Errorf("native request %s", native)
	}
}

func TestFromChat(t *testing.T) {
	t.Parallel()
	m := Meta{ID: "resp_abc", CreatedAt: 7, Model: "m", Store: true}
	out, err := FromChat(m, []byte(`{"choices":[{"message":{"role":"assistant","content":"hi","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"length"}],
		"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(out)
	for _, want := range []string{`"status":"incomplete"`, `"incomplete_details":{"reason":"max_output_tokens"}`, `"id":"msg_abc"`,
		`"type":"function_call"`, `"call_id":"call_1"`, `"id":"fc_1"`, `"input_tokens":5`, `"cached_tokens":2`, `"output_tokens":3`, `"total_tokens":8`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("response lacks %s: %s", want, b)
		}
	}
}

// events parses SSE frames into their data objects.
func events(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var v map[string]any
			if err := json.Unmarshal([]byte(d), &v); err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
	}
	return out
}

func TestEvents(t *testing.T) {
	t.Parallel()
	e := NewEvents(Meta{ID: "resp_x", Model: "m"})
	var buf []byte
	for _, c := range []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"choices":[{"index":0,"delta":{"content":"Hel"}}]}`,
		`{"choices":[{"index":0,"delta":{"content":"lo"}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_9","function":{"name":"f","arguments":""}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\""}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}}`,
	} {
		buf = append(buf, e.Chunk([]byte(c))...)
	}
	buf = append(buf, e.Done()...)
	evs := events(t, buf)
	var types []string
	for i, ev := range evs {
		types = append(types, ev["type"].(string))
		if int(ev["sequence_number"].(float64)) != i {
			t.Errorf("event %d: sequence_number %v", i, ev["sequence_number"])
		}
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added response.output_text.delta response.output_text.delta " +
		"response.output_text.done response.content_part.done response.output_item.done response.output_item.added response.function_call_arguments.delta " +
		"response.function_call_arguments.delta response.function_call_arguments.done response.output_item.done response.completed"
	if got := strings.Join(types, " "); got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	final := evs[len(evs)-1]["response"].(map[string]any)
	out := final["output"].([]any)
	if len(out) != 2 || out[1].(map[string]any)["arguments"] != `{"a":1}` || final["usage"].(map[string]any)["total_tokens"].(float64) != 10 ||
		out[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"] != "Hello" {
		t.Errorf("final response %v", final)
	}

	// A stream that breaks after its first token ends incomplete.
	e = NewEvents(Meta{ID: "resp_y"})
	buf = e.Chunk([]byte(`{"choices":[{"index":0,"delta":{"content":"Hi"}}]}`))
	buf = append(buf, e.Fail(true, "stream_interrupted", "cut")...)
	evs = events(t, buf)
	last := evs[len(evs)-1]
	if last["type"] != "response.incomplete" || last["response"].(map[string]any)["incomplete_details"].(map[string]any)["reason"] != ReasonInterrupted {
		t.Errorf("last event %v, want response.incomplete (interrupted)", last)
	}
}

func TestNativeStream(t *testing.T) {
	t.Parallel()
	s := NewNativeStream(1)
	var chunks [][]byte
	done := false
	for _, ev := range []string{
		`{"type":"response.created","response":{"id":"resp_1","model":"m","created_at":5,"status":"in_progress"}}`,
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"message"}}`,
		`{"type":"response.output_text.delta","output_index":0,"delta":"Hi"}`,
		`{"type":"response.output_item.added","output_index":1,"item":{"type":"function_call","call_id":"call_1","name":"f"}}`,
		`{"type":"response.function_call_arguments.delta","output_index":1,"delta":"{}"}`,
		`{"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}}`,
	} {
		c, d, err := s.Event([]byte(ev))
		if err != nil {
			t.Fatal(err)
		}
		chunks, done = append(chunks, c...), d
	}
	if !done || len(chunks) != 6 {
		t.Fatalf("done %v, %d chunks, want done and 6", done, len(chunks))
	}
	all := string(bytes.Join(chunks, []byte("\n")))
	for _, want := range []string{`"content":"Hi"`, `"id":"call_1"`, `"arguments":"{}"`, `"finish_reason":"tool_calls"`, `"prompt_tokens":3`, `"id":"resp_1"`} {
		if !strings.Contains(all, want) {
			t.Errorf("chunks lack %s:\n%s", want, all)
		}
	}
	if _, _, err := s.Event([]byte(`{"type":"response.failed","response":{"error":{"code":"server_error","message":"boom"}}}`)); err == nil {
		t.Error("response.failed: no error")
	}
}
