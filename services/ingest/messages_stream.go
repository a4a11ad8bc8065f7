package ingest

import (
	"encoding/json"
	"io"
	"net/http"
)

// eventFormat writes a relayed stream's events in one API's wire format.
// The relay (streamChat) reads OpenAI chat.completion.chunk objects from
// the job's stream subject, whatever the provider; a format writes them as
// its API's clients expect. Each method reports whether the write worked.
type eventFormat interface {
	// chunk writes one chat.completion.chunk.
	chunk(w io.Writer, c []byte) bool
	// done ends a stream whose job succeeded.
	done(w io.Writer) bool
	// fail ends a stream with an error: typ and code are OpenAI's (type
	// sluice_<status>, or the provider's error code), status the HTTP
	// status the same error would have had outside a stream.
	fail(w io.Writer, typ, code, msg string, status int) bool
	// keepAlive writes what keeps an idle connection open.
	keepAlive(w io.Writer) bool
}

// openAIEvents is OpenAI's stream: data: <chunk>, data: [DONE], an error
// object as data, and SSE comments as keep-alives.
type openAIEvents struct{}

func (openAIEvents) chunk(w io.Writer, c []byte) bool { return writeEvent(w, c) }
func (openAIEvents) done(w io.Writer) bool            { return writeEvent(w, []byte("[DONE]")) }
func (openAIEvents) fail(w io.Writer, typ, code, msg string, _ int) bool {
	return writeEvent(w, errorEvent(typ, code, msg))
}
func (openAIEvents) keepAlive(w io.Writer) bool {
	_, err := io.WriteString(w, ": keep-alive\n\n")
	return err == nil
}

// anthropicEvents is Anthropic's Messages stream, translated from OpenAI
// chunks as they come: message_start at the first chunk; a text block for
// content, a tool_use block per tool call (its arguments as
// input_json_delta), each opened by content_block_start and closed by
// content_block_stop when the next begins or the message ends; then
// message_delta (stop_reason and usage) and message_stop. Errors are
// event: error with Anthropic's error types; keep-alives are ping events.
// Every event names its type, which Anthropic's SDKs dispatch on.
type anthropicEvents struct {
	model   string // the model asked for, until a chunk names one
	started bool
	// open is the index of the open content block (-1: none), next the
	// index the next block gets; tools maps an OpenAI tool call index to
	// its block.
	open, next int
	tools      map[int]int
	openText   bool
	stop       string
	usage      *chatUsage
}

func newAnthropicEvents(model string) *anthropicEvents {
	return &anthropicEvents{model: model, open: -1, tools: map[int]int{}}
}

// chatChunk is the part of a chat.completion.chunk the translation reads.
type chatChunk struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content   *string `json:"content"`
			Refusal   *string `json:"refusal"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

func (a *anthropicEvents) emit(w io.Writer, typ string, v map[string]any) bool {
	v["type"] = typ
	data, err := json.Marshal(v)
	if err != nil { // only maps of our own values are encoded
		return false
	}
	buf := make([]byte, 0, len(typ)+len(data)+16)
	buf = append(buf, "event: "...)
	buf = append(buf, typ...)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	_, err = w.Write(buf)
	return err == nil
}

// begin writes message_start once.
func (a *anthropicEvents) begin(w io.Writer, id string) bool {
	if a.started {
		return true
	}
	a.started = true
	return a.emit(w, "message_start", map[string]any{"message": map[string]any{
		"id": messageID(id), "type": "message", "role": "assistant", "model": a.model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 0, "output_tokens": 0},
	}})
}

// closeBlock writes content_block_stop for the open block, if any.
func (a *anthropicEvents) closeBlock(w io.Writer) bool {
	if a.open < 0 {
		return true
	}
	i := a.open
	a.open, a.openText = -1, false
	return a.emit(w, "content_block_stop", map[string]any{"index": i})
}

// openBlock closes the open block and starts block, returning its index.
func (a *anthropicEvents) openBlock(w io.Writer, block map[string]any) (int, bool) {
	if !a.closeBlock(w) {
		return 0, false
	}
	i := a.next
	a.next++
	a.open = i
	return i, a.emit(w, "content_block_start", map[string]any{"index": i, "content_block": block})
}

func (a *anthropicEvents) chunk(w io.Writer, c []byte) bool {
	var ch chatChunk
	if json.Unmarshal(c, &ch) != nil {
		return true // not a chunk: nothing a Messages client could read
	}
	if ch.Model != "" {
		a.model = ch.Model
	}
	if !a.begin(w, ch.ID) {
		return false
	}
	if ch.Usage != nil {
		a.usage = ch.Usage
	}
	for _, choice := range ch.Choices {
		if choice.Index != 0 {
			continue // /v1/messages asks for one completion
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
			if !a.openText {
				if _, ok := a.openBlock(w, map[string]any{"type": "text", "text": ""}); !ok {
					return false
				}
				a.openText = true
			}
			if !a.emit(w, "content_block_delta", map[string]any{"index": a.open,
				"delta": map[string]any{"type": "text_delta", "text": text}}) {
				return false
			}
		}
		for _, tc := range d.ToolCalls {
			i, seen := a.tools[tc.Index]
			if !seen {
				var ok bool
				i, ok = a.openBlock(w, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Function.Name, "input": map[string]any{}})
				if !ok {
					return false
				}
				a.tools[tc.Index] = i
			}
			if tc.Function.Arguments == "" {
				continue
			}
			// A fragment for a block already closed (OpenAI streams one
			// call's arguments after another, so this is rare) is still
			// sent: the SDKs add a delta to its block by index, and
			// dropping it would lose part of the arguments.
			if !a.emit(w, "content_block_delta", map[string]any{"index": i,
				"delta": map[string]any{"type": "input_json_delta", "partial_json": tc.Function.Arguments}}) {
				return false
			}
		}
		if choice.FinishReason != nil && *choice.FinishReason != "" {
			a.stop = stopReason(*choice.FinishReason)
		}
	}
	return true
}

func (a *anthropicEvents) done(w io.Writer) bool {
	if !a.begin(w, "") || !a.closeBlock(w) {
		return false
	}
	stop := a.stop
	if stop == "" {
		stop = "end_turn"
	}
	usage := map[string]any{"output_tokens": 0}
	if u := a.usage; u != nil {
		in, cached, written := u.split()
		usage = map[string]any{"input_tokens": in, "output_tokens": u.CompletionTokens,
			"cache_read_input_tokens": cached, "cache_creation_input_tokens": written}
	}
	return a.emit(w, "message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": usage}) &&
		a.emit(w, "message_stop", map[string]any{})
}

func (a *anthropicEvents) fail(w io.Writer, _, _, msg string, status int) bool {
	return a.emit(w, "error", map[string]any{"error": map[string]any{"type": anthropicErrorType(status), "message": msg}})
}

func (a *anthropicEvents) keepAlive(w io.Writer) bool {
	return a.emit(w, "ping", map[string]any{})
}

// beginStream turns a captured answer into a stream: the headers set so far
// go to the client's writer, which the relay writes Anthropic's events to.
func (c *captured) beginStream() http.ResponseWriter {
	h := c.real.Header()
	for k, v := range c.h {
		if k != "Content-Length" {
			h[k] = v
		}
	}
	c.streamed = true
	return c.real
}
