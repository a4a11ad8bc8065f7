package wire

import (
	"encoding/json"
	"maps"
)

// Events translates a chat.completion.chunk stream into the Responses
// API's typed server-sent events, as the chunks come: response.created
// and response.in_progress first; per output item output_item.added,
// then for a message content_part.added and output_text.delta, for a
// function call function_call_arguments.delta; the matching .done events
// when the next item begins or the stream ends; then response.completed
// (or response.incomplete) with the whole Response and its usage. Every
// event carries its type and a sequence_number from 0. Its methods return
// the bytes to write (SSE frames), so it does no I/O.
type Events struct {
	meta     Meta
	out      *output
	seq      int
	started  bool
	open     int // index in out.items of the item open (-1: none)
	finish   string
	usage    *Usage
	finished bool
}

// NewEvents returns the translator for the response m describes.
func NewEvents(m Meta) *Events {
	return &Events{meta: m, out: newOutput(m.ID), open: -1}
}

func (e *Events) frame(buf []byte, typ string, v map[string]any) []byte {
	v["type"] = typ
	v["sequence_number"] = e.seq
	e.seq++
	data, err := marshal(v)
	if err != nil { // only maps of our own values are encoded
		return buf
	}
	buf = append(buf, "event: "...)
	buf = append(buf, typ...)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, data...)
	return append(buf, "\n\n"...)
}

// snapshot is the Response as it stands (items copied, so later events do
// not change what an earlier one said).
func (e *Events) snapshot(status string, items []map[string]any, reason string, f *Failure) map[string]any {
	cp := make([]map[string]any, len(items))
	for i, it := range items {
		cp[i] = maps.Clone(it)
	}
	var u *Usage
	if status != StatusInProgress {
		u = e.usage
	}
	return Response(e.meta, status, cp, u, reason, f)
}

func (e *Events) begin(buf []byte) []byte {
	if e.started {
		return buf
	}
	e.started = true
	buf = e.frame(buf, "response.created", map[string]any{"response": e.snapshot(StatusInProgress, nil, "", nil)})
	return e.frame(buf, "response.in_progress", map[string]any{"response": e.snapshot(StatusInProgress, nil, "", nil)})
}

// closeOpen writes the .done events of the open item, with status.
func (e *Events) closeOpen(buf []byte, status string) []byte {
	if e.open < 0 {
		return buf
	}
	k := e.open
	e.open = -1
	it := e.out.items[k]
	it["status"] = status
	id, _ := it["id"].(string)
	if it["type"] == "message" {
		text := e.out.text.String()
		it["content"] = []any{textPart(text)}
		buf = e.frame(buf, "response.output_text.done", map[string]any{"item_id": id, "output_index": k, "content_index": 0, "text": text, "logprobs": []any{}})
		buf = e.frame(buf, "response.content_part.done", map[string]any{"item_id": id, "output_index": k, "content_index": 0, "part": textPart(text)})
	} else {
		buf = e.frame(buf, "response.function_call_arguments.done", map[string]any{"item_id": id, "output_index": k, "arguments": it["arguments"], "name": it["name"]})
	}
	return e.frame(buf, "response.output_item.done", map[string]any{"output_index": k, "item": maps.Clone(it)})
}

// Chunk translates one chat.completion.chunk.
func (e *Events) Chunk(c []byte) []byte {
	var ch chatChunk
	if json.Unmarshal(c, &ch) != nil {
		return nil // not a chunk: nothing a Responses client could read
	}
	buf := e.begin(nil)
	if ch.Usage != nil {
		e.usage = ch.Usage.responses()
	}
	if len(ch.Items) > 0 {
		// The provider's own items (reasoning, built-in tool calls)
		// arrive whole: each is added and done at once.
		buf = e.closeOpen(buf, StatusCompleted)
		for _, k := range e.out.addNative(ch.Items) {
			it := e.out.items[k]
			buf = e.frame(buf, "response.output_item.added", map[string]any{"output_index": k, "item": maps.Clone(it)})
			buf = e.frame(buf, "response.output_item.done", map[string]any{"output_index": k, "item": maps.Clone(it)})
		}
	}
	for _, choice := range ch.Choices {
		if choice.Index != 0 {
			continue
		}
		d := choice.Delta
		text := ""
		switch {
		case d.Content != nil:
			text = *d.Content
		case d.Refusal != nil:
			text = *d.Refusal
		}
		if text != "" {
			if e.out.msg < 0 || e.open != e.out.msg {
				buf = e.closeOpen(buf, StatusCompleted)
			}
			if e.out.addText(text) {
				k := e.out.msg
				e.open = k
				buf = e.frame(buf, "response.output_item.added", map[string]any{"output_index": k, "item": maps.Clone(e.out.items[k])})
				buf = e.frame(buf, "response.content_part.added", map[string]any{"item_id": e.out.messageID(), "output_index": k, "content_index": 0,
					"part": textPart("")})
			}
			e.open = e.out.msg
			buf = e.frame(buf, "response.output_text.delta", map[string]any{"item_id": e.out.messageID(), "output_index": e.out.msg,
				"content_index": 0, "delta": text, "logprobs": []any{}})
		}
		for _, tc := range d.ToolCalls {
			k, seen := e.out.calls[tc.Index]
			if !seen {
				buf = e.closeOpen(buf, StatusCompleted)
				e.out.addCall(tc.Index, tc.ID, tc.Function.Name, "")
				k = e.out.calls[tc.Index]
				e.open = k
				buf = e.frame(buf, "response.output_item.added", map[string]any{"output_index": k, "item": maps.Clone(e.out.items[k])})
			}
			if tc.Function.Arguments == "" {
				continue
			}
			e.out.addCall(tc.Index, "", "", tc.Function.Arguments)
			buf = e.frame(buf, "response.function_call_arguments.delta", map[string]any{"item_id": e.out.items[k]["id"], "output_index": k,
				"delta": tc.Function.Arguments})
		}
		if choice.FinishReason != nil && *choice.FinishReason != "" {
			e.finish = *choice.FinishReason
		}
	}
	return buf
}

// Done ends a stream whose answer is whole: response.completed, or
// response.incomplete when the output limit or a content filter cut it.
func (e *Events) Done() []byte {
	if e.finished {
		return nil
	}
	e.finished = true
	status, reason := statusOf(e.finish)
	buf := e.begin(nil)
	buf = e.closeOpen(buf, itemStatus(status))
	items := e.out.finish(itemStatus(status))
	typ := "response.completed"
	if status == StatusIncomplete {
		typ = "response.incomplete"
	}
	return e.frame(buf, typ, map[string]any{"response": e.snapshot(status, items, reason, nil)})
}

// Fail ends a stream that did not finish. interrupted: it broke after its
// first token, and the response is incomplete with what was sent;
// otherwise the response failed with code and msg.
func (e *Events) Fail(interrupted bool, code, msg string) []byte {
	if e.finished {
		return nil
	}
	e.finished = true
	buf := e.begin(nil)
	buf = e.closeOpen(buf, StatusIncomplete)
	items := e.out.finish(StatusIncomplete)
	if interrupted {
		return e.frame(buf, "response.incomplete", map[string]any{"response": e.snapshot(StatusIncomplete, items, ReasonInterrupted, nil)})
	}
	return e.frame(buf, "response.failed", map[string]any{"response": e.snapshot(StatusFailed, items, "", &Failure{Code: code, Message: msg})})
}

// Started reports whether any event was written.
func (e *Events) Started() bool { return e.started }
