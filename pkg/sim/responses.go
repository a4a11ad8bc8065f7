package sim

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/sluice-dev/sluice/pkg/job"
)

// The Responses API (POST /v1/responses), served natively unless
// Config.NoResponses: a request is charged like a chat completion (its
// input counted as the equivalent messages, max_output_tokens as the
// output limit) and answered with a Response object, or with the typed
// stream events (response.created … response.completed, each with a
// sequence_number). Stream faults cut or stall it as they do a chat
// stream, counting output_text deltas as content chunks.
//
// Built-in tools and reasoning: a Responses request may offer any tool
// type (the simulator "runs" a web_search tool: its answer starts with a
// completed web_search_call item); a reasoning model's answer starts
// with a reasoning item, with an encrypted_content when include asks for
// reasoning.encrypted_content. Input items of any *_call or
// *_call_output type, and reasoning items, are accepted and not counted;
// with store false a reasoning item without its encrypted_content is
// refused, as OpenAI refuses it (it names reasoning nothing kept).
//
// Tool calls (all three APIs): with Config.ToolCalls > 0, a request that
// offers function tools, and whose conversation holds fewer than
// ToolCalls tool results, is answered with one call of the next tool
// (the tools in turn) instead of text, its arguments {"n": k} for the
// k-th call. So an agent loop runs a fixed number of rounds and then
// gets its answer.

// Request is one request the simulator received (Requests).
type Request struct {
	Path string
	Body []byte
}

// recorder keeps the last maxReceived requests of the chat, embeddings and
// responses endpoints.
type recorder struct {
	mu   sync.Mutex
	reqs []Request
}

func (r *recorder) add(path string, body []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, Request{Path: path, Body: body})
	if len(r.reqs) > maxReceived {
		r.reqs = append(r.reqs[:0], r.reqs[len(r.reqs)-maxReceived:]...)
	}
}

// Requests returns the last requests to /v1/chat/completions,
// /v1/embeddings and /v1/responses (up to 64, oldest first), as they
// arrived; /v1/messages has Received.
func (s *Server) Requests() []Request {
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	return append([]Request(nil), s.rec.reqs...)
}

// toolCall is the tool call the simulator answers with.
type toolCall struct {
	id, name, args string
}

// pickTool decides the tool call for a request offering tools whose
// conversation holds results tool results, under its tool_choice
// (schema.go): a call it requires always, else one while Config.ToolCalls
// rounds are not done.
func (s *Server) pickTool(tools []toolDef, results int, choice json.RawMessage) *toolCall {
	none, required, name := toolChoice(choice)
	if len(tools) == 0 || none || !required && (s.cfg.ToolCalls <= 0 || results >= s.cfg.ToolCalls) {
		return nil
	}
	t := tools[results%len(tools)]
	for _, d := range tools {
		if name != "" && d.name == name {
			t = d
		}
	}
	return &toolCall{id: "call_" + randomID(24), name: t.name, args: toolArgs(t.params, results+1)}
}

// chatTool is the tool call for a chat-completions body.
func (s *Server) chatTool(body []byte) *toolCall {
	var b struct {
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
		Tools []struct {
			Function struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
		ToolChoice json.RawMessage `json:"tool_choice"`
	}
	if json.Unmarshal(body, &b) != nil {
		return nil
	}
	var tools []toolDef
	for _, t := range b.Tools {
		tools = append(tools, toolDef{t.Function.Name, t.Function.Parameters})
	}
	results := 0
	for _, m := range b.Messages {
		if m.Role == "tool" {
			results++
		}
	}
	return s.pickTool(tools, results, b.ToolChoice)
}

// anthropicTool is the tool call for a Messages body.
func (s *Server) anthropicTool(body []byte) *toolCall {
	var b struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools []struct {
			Name        string          `json:"name"`
			InputSchema json.RawMessage `json:"input_schema"`
		} `json:"tools"`
		ToolChoice json.RawMessage `json:"tool_choice"`
	}
	if json.Unmarshal(body, &b) != nil {
		return nil
	}
	var tools []toolDef
	for _, t := range b.Tools {
		tools = append(tools, toolDef{t.Name, t.InputSchema})
	}
	results := 0
	for _, m := range b.Messages {
		var blocks []struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(m.Content, &blocks)
		for _, bl := range blocks {
			if bl.Type == "tool_result" {
				results++
			}
		}
	}
	tc := s.pickTool(tools, results, b.ToolChoice)
	if tc != nil {
		tc.id = "toolu_" + randomID(24)
	}
	return tc
}

// responsesBody is the part of a Responses request the simulator reads.
type responsesBody struct {
	Model           string          `json:"model"`
	Instructions    string          `json:"instructions"`
	Input           json.RawMessage `json:"input"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
	Tools           []struct {
		Type       string          `json:"type"`
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"`
	Include    []string        `json:"include"`
	Store      *bool           `json:"store"`
}

// parseResponses reads a Responses body: charged as the chat request with
// the same text would be.
func (s *Server) parseResponses(body []byte) (*call, error) {
	var b responsesBody
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, fmt.Errorf("malformed Responses request: %v", err)
	}
	if b.Model == "" {
		return nil, fmt.Errorf("model: is required")
	}
	var msgs []job.ChatMessage
	text := func(role, s string) {
		raw, _ := json.Marshal(s)
		msgs = append(msgs, job.ChatMessage{Role: role, Content: raw})
	}
	if b.Instructions != "" {
		text("system", b.Instructions)
	}
	results := 0
	var one string
	var items []struct {
		Type      string          `json:"type"`
		ID        string          `json:"id"`
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		Arguments string          `json:"arguments"`
		Output    json.RawMessage `json:"output"`
		Encrypted string          `json:"encrypted_content"`
	}
	switch {
	case json.Unmarshal(b.Input, &one) == nil:
		text("user", one)
	case json.Unmarshal(b.Input, &items) == nil:
		for _, it := range items {
			switch it.Type {
			case "", "message":
				if it.Role == "" {
					return nil, fmt.Errorf("input: a message needs a role")
				}
				msgs = append(msgs, job.ChatMessage{Role: it.Role, Content: it.Content})
			case "function_call":
				text("assistant", it.Arguments)
			case "function_call_output":
				results++
				var out string
				_ = json.Unmarshal(it.Output, &out)
				text("tool", out)
			case "reasoning":
				// As OpenAI: with store false nothing was kept to find by id.
				if it.Encrypted == "" && b.Store != nil && !*b.Store {
					return nil, fmt.Errorf("Item with id '%s' not found. Items are not persisted when `store` is set to false.", it.ID)
				}
			default:
				if strings.HasSuffix(it.Type, "_call") || strings.HasSuffix(it.Type, "_call_output") {
					continue
				}
				return nil, fmt.Errorf("input: item type %q is not supported by the simulator", it.Type)
			}
		}
	default:
		return nil, fmt.Errorf("input: must be a string or a list of items")
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("input: is required")
	}
	maxOut := s.cfg.DefaultMaxTokens
	if b.MaxOutputTokens != nil {
		if *b.MaxOutputTokens < 1 {
			return nil, fmt.Errorf("max_output_tokens: must be positive")
		}
		maxOut = *b.MaxOutputTokens
	}
	var tools []toolDef
	search := false
	for _, t := range b.Tools {
		switch {
		case t.Type == "":
			return nil, fmt.Errorf("tools: a tool needs a type")
		case t.Type == "function":
			tools = append(tools, toolDef{t.Name, t.Parameters})
		case strings.HasPrefix(t.Type, "web_search"):
			search = true
		}
	}
	c := &call{model: b.Model, prompt: s.cfg.Count.Prompt(&job.ChatRequest{Model: b.Model, Messages: msgs}), maxOut: maxOut, n: 1,
		stream: b.Stream, usage: true, responses: true, reasoning: s.reasoning[b.Model], tool: s.pickTool(tools, results, b.ToolChoice)}
	if c.reasoning {
		r := map[string]any{"type": "reasoning", "id": "rs_" + randomID(24), "summary": []any{}}
		if slices.Contains(b.Include, "reasoning.encrypted_content") {
			r["encrypted_content"] = "enc_" + randomID(32)
		}
		c.before = append(c.before, r)
	}
	if search && c.tool == nil {
		c.before = append(c.before, map[string]any{"type": "web_search_call", "id": "ws_" + randomID(24), "status": "completed",
			"action": map[string]any{"type": "search", "query": "simulated"}})
	}
	c.cost = int64(c.prompt) + int64(c.maxOut)
	return c, nil
}

// simResponse builds a Response for a completed Responses call.
func (s *Server) simResponse(c *call, completion int, created int64, status string, text string) map[string]any {
	id := "resp_" + randomID(24)
	output := append([]map[string]any(nil), c.before...)
	if c.tool != nil {
		output = append(output, map[string]any{"type": "function_call", "id": "fc_" + randomID(24), "call_id": c.tool.id,
			"name": c.tool.name, "arguments": c.tool.args, "status": "completed"})
	} else {
		output = append(output, map[string]any{"type": "message", "id": "msg_" + randomID(24), "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}})
	}
	r := map[string]any{"id": id, "object": "response", "created_at": created, "status": status, "model": c.model, "output": output,
		"error": nil, "incomplete_details": nil,
		"usage": map[string]any{"input_tokens": c.prompt, "input_tokens_details": map[string]int{"cached_tokens": 0},
			"output_tokens": completion, "output_tokens_details": map[string]int{"reasoning_tokens": c.reasoningTokens(completion)},
			"total_tokens": c.prompt + completion}}
	if status == "incomplete" {
		r["incomplete_details"] = map[string]any{"reason": "max_output_tokens"}
	}
	return r
}

// responseStatus is a Responses call's status for its output length.
func responseStatus(c *call, completion int) string {
	if c.tool == nil && completion >= c.maxOut {
		return "incomplete"
	}
	return "completed"
}

// newResponse is complete's answer to a Responses call.
func (s *Server) newResponse(c *call, completion int) map[string]any {
	text := s.filler.text(completion) + strings.Repeat(".", s.cfg.PadResponseBytes)
	return s.simResponse(c, completion, s.cfg.Now().Unix(), responseStatus(c, completion), text)
}

// respEvents writes typed Responses events.
type respEvents struct {
	out sse
	seq int
}

func (e *respEvents) send(typ string, v map[string]any) bool {
	v["type"] = typ
	v["sequence_number"] = e.seq
	e.seq++
	b, err := json.Marshal(v)
	if err != nil { // only our own values are written
		panic(fmt.Sprintf("sim: encoding event: %v", err))
	}
	buf := make([]byte, 0, len(b)+len(typ)+16)
	buf = append(buf, "event: "...)
	buf = append(buf, typ...)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	if _, err := e.out.w.Write(buf); err != nil {
		return false
	}
	return e.out.rc.Flush() == nil
}

// streamResponse answers an admitted streamed Responses call, as
// streamCompletion does a chat one: the events after TTFT, a delta per
// token PerToken apart, stream faults after StreamCutAfter (or
// StreamStallAfter) deltas, the completion recorded once a token was
// sent.
func (s *Server) streamResponse(w http.ResponseWriter, r *http.Request, g *generation, m *modelState, c *call, e *entry, arrival int64, f fault) {
	run := s.newStreamRun(w, r, g, m, c, e, arrival, f)
	pieces := run.pieces()
	full := s.simResponse(c, run.completion, s.cfg.Now().Unix(), responseStatus(c, run.completion), strings.Join(pieces, ""))
	m.peek(s.now()).set(w.Header(), s.form)
	ev := &respEvents{out: startSSE(w)}
	g.streamed.Add(1)
	s.count(g, m, http.StatusOK)
	k, item := answerItem(full)
	itemID := item["id"]
	if c.tool != nil {
		pieces = []string{c.tool.args}
	}
	if !sleep(r.Context(), s.cfg.TTFT) || !beginResponseStream(ev, full, item) {
		run.gone(true)
		return
	}
	write := func(p string) bool {
		if c.tool != nil {
			return ev.send("response.function_call_arguments.delta", map[string]any{"item_id": itemID, "output_index": k, "delta": p})
		}
		return ev.send("response.output_text.delta", map[string]any{"item_id": itemID, "output_index": k, "content_index": 0, "delta": p, "logprobs": []any{}})
	}
	if !run.send(pieces, write) || run.faulted() {
		return
	}
	body, err := json.Marshal(full)
	if err != nil {
		panic(fmt.Sprintf("sim: encoding response: %v", err))
	}
	run.finished(body)
	if !s.finishResponseStream(ev, full) {
		g.clientGone.Add(1)
	}
}

// answerItem is a Response's last output item (its message or function
// call: any before it are reasoning or built-in tool calls) and its index.
func answerItem(full map[string]any) (int, map[string]any) {
	out := full["output"].([]map[string]any)
	return len(out) - 1, out[len(out)-1]
}

// beginResponseStream writes the events before a Response's first delta:
// created and in_progress (the response without output), the items
// before the answer added and done, the answer's item added and, for a
// message, its text part added.
func beginResponseStream(ev *respEvents, full, item map[string]any) bool {
	started := maps.Clone(full)
	started["status"], started["output"], started["usage"], started["incomplete_details"] = "in_progress", []any{}, nil, nil
	added := maps.Clone(item)
	added["status"] = "in_progress"
	if item["type"] == "function_call" {
		added["arguments"] = ""
	} else {
		added["content"] = []any{}
	}
	ok := ev.send("response.created", map[string]any{"response": started}) && ev.send("response.in_progress", map[string]any{"response": started})
	k, _ := answerItem(full)
	for i, it := range full["output"].([]map[string]any)[:k] {
		ok = ok && ev.send("response.output_item.added", map[string]any{"output_index": i, "item": it}) &&
			ev.send("response.output_item.done", map[string]any{"output_index": i, "item": it})
	}
	ok = ok && ev.send("response.output_item.added", map[string]any{"output_index": k, "item": added})
	if item["type"] == "function_call" {
		return ok
	}
	return ok && ev.send("response.content_part.added", map[string]any{"item_id": item["id"], "output_index": k, "content_index": 0,
		"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
}

// chatDeltas is how a chat stream sends the tool call: a delta naming it,
// then its arguments in two pieces.
func (t *toolCall) chatDeltas() (head map[string]any, pieces []string, delta func(string) map[string]any) {
	head = map[string]any{"tool_calls": []any{map[string]any{"index": 0, "id": t.id, "type": "function",
		"function": map[string]any{"name": t.name, "arguments": ""}}}}
	cut := len(t.args) / 2
	delta = func(p string) map[string]any {
		return map[string]any{"tool_calls": []any{map[string]any{"index": 0, "function": map[string]any{"arguments": p}}}}
	}
	return head, []string{t.args[:cut], t.args[cut:]}, delta
}

// finishResponseStream writes the .done events of a Response's one item
// and its terminal event.
func (s *Server) finishResponseStream(ev *respEvents, full map[string]any) bool {
	k, item := answerItem(full)
	id := item["id"]
	ok := true
	if item["type"] == "function_call" {
		ok = ev.send("response.function_call_arguments.done", map[string]any{"item_id": id, "output_index": k, "arguments": item["arguments"]})
	} else {
		part := item["content"].([]any)[0]
		ok = ev.send("response.output_text.done", map[string]any{"item_id": id, "output_index": k, "content_index": 0,
			"text": part.(map[string]any)["text"], "logprobs": []any{}}) &&
			ev.send("response.content_part.done", map[string]any{"item_id": id, "output_index": k, "content_index": 0, "part": part})
	}
	typ := "response.completed"
	if full["status"] == "incomplete" {
		typ = "response.incomplete"
	}
	return ok && ev.send("response.output_item.done", map[string]any{"output_index": k, "item": item}) &&
		ev.send(typ, map[string]any{"response": full})
}

// replayResponseStream answers a streamed Responses request from a stored
// Response (the idempotency ledger).
func (s *Server) replayResponseStream(w http.ResponseWriter, g *generation, m *modelState, body []byte) {
	var full map[string]any
	if json.Unmarshal(body, &full) != nil {
		return
	}
	raw, _ := json.Marshal(full["output"])
	var items []map[string]any
	_ = json.Unmarshal(raw, &items)
	if len(items) == 0 {
		return
	}
	full["output"] = items
	m.peek(s.now()).set(w.Header(), s.form)
	w.Header().Set("Idempotent-Replayed", "true")
	ev := &respEvents{out: startSSE(w)}
	g.replayed.Add(1)
	s.count(g, m, http.StatusOK)
	started := map[string]any{"id": full["id"], "object": "response", "created_at": full["created_at"], "status": "in_progress",
		"model": full["model"], "output": []any{}}
	ok := ev.send("response.created", map[string]any{"response": started})
	for i, it := range items[:len(items)-1] {
		ok = ok && ev.send("response.output_item.added", map[string]any{"output_index": i, "item": it}) &&
			ev.send("response.output_item.done", map[string]any{"output_index": i, "item": it})
	}
	_ = ok && ev.send("response.output_item.added", map[string]any{"output_index": len(items) - 1, "item": items[len(items)-1]}) &&
		s.finishResponseStream(ev, full)
}

// streamMessage writes a Messages answer (resp, as the unstreamed call
// returns it) as Anthropic's event stream: message_start, each content
// block as content_block_start, its deltas (text_delta per word,
// input_json_delta in two pieces) and content_block_stop, then
// message_delta with the stop reason and output tokens, and message_stop.
// The generation's latency was already waited out.
func (s *Server) streamMessage(w http.ResponseWriter, resp map[string]any) {
	out := startSSE(w)
	send := func(typ string, v map[string]any) bool {
		v["type"] = typ
		b, err := json.Marshal(v)
		if err != nil { // only our own values are written
			panic(fmt.Sprintf("sim: encoding event: %v", err))
		}
		if _, err := fmt.Fprintf(out.w, "event: %s\ndata: %s\n\n", typ, b); err != nil {
			return false
		}
		return out.rc.Flush() == nil
	}
	usage := resp["usage"].(map[string]any)
	start := map[string]any{"id": resp["id"], "type": "message", "role": "assistant", "model": resp["model"], "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": usage["input_tokens"], "output_tokens": 1,
			"cache_creation_input_tokens": usage["cache_creation_input_tokens"], "cache_read_input_tokens": usage["cache_read_input_tokens"]}}
	if !send("message_start", map[string]any{"message": start}) {
		return
	}
	for i, b := range resp["content"].([]map[string]any) {
		var deltas []map[string]any
		block := map[string]any{"type": b["type"]}
		if b["type"] == "tool_use" {
			block["id"], block["name"], block["input"] = b["id"], b["name"], map[string]any{}
			args := string(b["input"].(json.RawMessage))
			cut := len(args) / 2
			for _, p := range []string{args[:cut], args[cut:]} {
				deltas = append(deltas, map[string]any{"type": "input_json_delta", "partial_json": p})
			}
		} else {
			block["text"] = ""
			words := strings.SplitAfter(b["text"].(string), " ")
			for _, p := range words {
				deltas = append(deltas, map[string]any{"type": "text_delta", "text": p})
			}
		}
		if !send("content_block_start", map[string]any{"index": i, "content_block": block}) {
			return
		}
		for _, d := range deltas {
			if !send("content_block_delta", map[string]any{"index": i, "delta": d}) {
				return
			}
		}
		if !send("content_block_stop", map[string]any{"index": i}) {
			return
		}
	}
	_ = send("message_delta", map[string]any{"delta": map[string]any{"stop_reason": resp["stop_reason"], "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": usage["output_tokens"]}}) && send("message_stop", map[string]any{})
}
