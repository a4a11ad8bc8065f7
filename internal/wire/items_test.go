package wire

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/job"
)

// A request with reasoning items and a built-in tool reaches a native
// provider with its items and tools as sent; any other provider gets the
// chat body without them, or a refusal naming the built-in tool.
func TestNativeMember(t *testing.T) {
	t.Parallel()
	reasoning := `{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"ENC"}`
	r, err := ParseRequest([]byte(`{"model":"m","instructions":"Be brief.","include":["reasoning.encrypted_content"],
		"reasoning":{"effort":"low","summary":"auto"},"tools":[{"type":"web_search","search_context_size":"low"},{"type":"function","name":"f"}],
		"input":[{"role":"user","content":"hi"},` + reasoning + `,{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"one"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.InputMessages(); err != nil {
		t.Fatalf("reasoning items on a translated model: %v, want them dropped", err)
	}
	items, err := r.Items()
	if err != nil {
		t.Fatal(err)
	}
	in, err := ChatMessages(items, true)
	if err != nil {
		t.Fatal(err)
	}
	n := r.Native(items)
	if n == nil {
		t.Fatal("no native member for reasoning items and a built-in tool")
	}
	chat, err := r.ChatBody(nil, in, ChatOptions{Native: n})
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Tools []json.RawMessage `json:"tools"`
	}
	if json.Unmarshal(chat, &c) != nil || len(c.Tools) != 1 || !strings.Contains(string(c.Tools[0]), `"function"`) {
		t.Errorf("chat tools %s, want the function tool only", c.Tools)
	}
	up, err := ChatToResponses(chat)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Input        []json.RawMessage `json:"input"`
		Tools        []json.RawMessage `json:"tools"`
		Include      []string          `json:"include"`
		Reasoning    json.RawMessage   `json:"reasoning"`
		Instructions string            `json:"instructions"`
		Store        bool              `json:"store"`
	}
	if err := json.Unmarshal(up, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Input) != 4 || string(got.Input[1]) != reasoning || len(got.Tools) != 2 || !strings.Contains(string(got.Tools[0]), `"search_context_size":"low"`) ||
		len(got.Include) != 1 || !strings.Contains(string(got.Reasoning), `"summary":"auto"`) || got.Instructions != "Be brief." || got.Store {
		t.Errorf("native request %s: want the input items, tools, include and reasoning as sent, store false", up)
	}
	if _, err := ForChat(chat); err == nil || !strings.Contains(err.Error(), `"web_search"`) {
		t.Errorf("ForChat with a built-in tool: %v, want a refusal naming web_search", err)
	}
	if _, err := ChatToAnthropic(chat, ""); err == nil || !strings.Contains(err.Error(), `"web_search"`) {
		t.Errorf("ChatToAnthropic with a built-in tool: %v, want a refusal naming web_search", err)
	}

	// Without a built-in tool, translation drops the member and its reasoning.
	r.Tools = r.Tools[1:]
	chat, _ = r.ChatBody(nil, in, ChatOptions{Native: r.Native(items)})
	plain, err := ForChat(chat)
	if err != nil || strings.Contains(string(plain), NativeMember) || strings.Contains(string(plain), "ENC") {
		t.Errorf("ForChat: %v %s, want the chat body without the native member", err, plain)
	}

	// A plain conversation needs no member.
	p, _ := ParseRequest([]byte(`{"model":"m","input":"hi"}`))
	pi, _ := p.Items()
	if p.Native(pi) != nil {
		t.Error("a plain request got a native member")
	}
}

// A native answer's reasoning and built-in tool items come back in the
// Response, in order, before the message, with their own status.
func TestNativeItemsOut(t *testing.T) {
	t.Parallel()
	body := `{"id":"resp_p","object":"response","created_at":1,"model":"m","status":"completed","output":[
		{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"ENC"},
		{"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":"q"}},
		{"type":"message","id":"msg_p","role":"assistant","status":"completed","content":[{"type":"output_text","text":"hello","annotations":[]}]}],
		"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}`
	chat, err := ResponseToChat([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, out map[string]any) {
		t.Helper()
		items := out["output"].([]map[string]any)
		if len(items) != 3 || items[0]["type"] != "reasoning" || items[0]["encrypted_content"] != "ENC" || items[1]["type"] != "web_search_call" ||
			items[1]["status"] != "completed" || items[2]["type"] != "message" {
			t.Errorf("%s: output %v, want reasoning, web_search_call, message", what, items)
		}
	}
	out, err := FromChat(Meta{ID: "resp_x"}, chat)
	if err != nil {
		t.Fatal(err)
	}
	check("FromChat", out)

	// The same through a stream: chunks, assembled as the executor does,
	// and as the Responses events.
	ns := NewNativeStream(1)
	var tr job.Transcript
	ev := NewEvents(Meta{ID: "resp_x"})
	var frames strings.Builder
	for _, e := range []string{`{"type":"response.created","response":{"id":"resp_p","model":"m","status":"in_progress","output":[]}}`,
		`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"ENC"}}`,
		`{"type":"response.output_item.done","output_index":1,"item":{"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search","query":"q"}}}`,
		`{"type":"response.output_text.delta","output_index":2,"delta":"hello"}`,
		`{"type":"response.completed","response":` + body + `}`} {
		chunks, _, err := ns.Event([]byte(e))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chunks {
			var ch job.Chunk
			if err := json.Unmarshal(c, &ch); err != nil {
				t.Fatal(err)
			}
			tr.Add(&ch)
			frames.Write(ev.Chunk(c))
		}
	}
	out, err = FromChat(Meta{ID: "resp_x"}, tr.Completion())
	if err != nil {
		t.Fatal(err)
	}
	check("the transcript", out)
	frames.Write(ev.Done())
	s := frames.String()
	if strings.Count(s, "event: response.output_item.done") != 3 || !strings.Contains(s, `"encrypted_content":"ENC"`) {
		t.Errorf("events: want an output_item.done per item, the reasoning whole:\n%s", s)
	}
	// A relay replaying the result as chunks keeps them too.
	tr = job.Transcript{}
	for _, c := range job.CompletionChunks(chat, true) {
		var ch job.Chunk
		_ = json.Unmarshal(c, &ch)
		tr.Add(&ch)
	}
	out, _ = FromChat(Meta{ID: "resp_x"}, tr.Completion())
	check("the replayed chunks", out)
}

func TestListItem(t *testing.T) {
	t.Parallel()
	a, _ := ListItem(json.RawMessage(`{"role":"user","content":"hi"}`), 0)
	b, _ := ListItem(json.RawMessage(`{"role":"user","content":"hi"}`), 0)
	c, _ := ListItem(json.RawMessage(`{"role":"user","content":"hi"}`), 1)
	if a["type"] != "message" || a["status"] != "completed" || a["id"] != b["id"] || a["id"] == c["id"] || !strings.HasPrefix(a["id"].(string), "msg_") {
		t.Errorf("ListItem: %v (again %v, at 1 %v): want a message with a stable id by place", a, b["id"], c["id"])
	}
	if parts, ok := a["content"].([]any); !ok || parts[0].(map[string]any)["type"] != "input_text" {
		t.Errorf("content %v, want one input_text part", a["content"])
	}
}
