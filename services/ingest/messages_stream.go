package ingest

import (
	"io"

	"github.com/sluice-dev/sluice/internal/wire"
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
	// status the same error would have had outside a stream, rid the
	// request's id (api.RequestID).
	fail(w io.Writer, typ, code, msg string, status int, rid string) bool
	// keepAlive writes what keeps an idle connection open.
	keepAlive(w io.Writer) bool
}

// openAIEvents is OpenAI's stream: data: <chunk>, data: [DONE], an error
// object as data, and SSE comments as keep-alives.
type openAIEvents struct{}

func (openAIEvents) chunk(w io.Writer, c []byte) bool { return writeEvent(w, c) }
func (openAIEvents) done(w io.Writer) bool            { return writeEvent(w, []byte("[DONE]")) }
func (openAIEvents) fail(w io.Writer, typ, code, msg string, _ int, rid string) bool {
	return writeEvent(w, errorEvent(typ, code, msg, rid))
}
func (openAIEvents) keepAlive(w io.Writer) bool {
	_, err := io.WriteString(w, ": keep-alive\n\n")
	return err == nil
}

// anthropicEvents is Anthropic's Messages stream (wire.MessageEvents).
type anthropicEvents struct{ e *wire.MessageEvents }

func newAnthropicEvents(model string) anthropicEvents {
	return anthropicEvents{wire.NewMessageEvents(model)}
}

func (a anthropicEvents) chunk(w io.Writer, c []byte) bool { return a.e.Chunk(w, c) }
func (a anthropicEvents) done(w io.Writer) bool            { return a.e.Done(w) }
func (a anthropicEvents) fail(w io.Writer, _, _, msg string, status int, rid string) bool {
	return a.e.Fail(w, msg, status, rid)
}
func (a anthropicEvents) keepAlive(w io.Writer) bool { return a.e.KeepAlive(w) }
