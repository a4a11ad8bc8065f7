package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/sluice-dev/sluice/pkg/job"
)

// chunk is OpenAI's chat.completion.chunk.
type chunk struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	ServiceTier       string          `json:"service_tier"`
	SystemFingerprint string          `json:"system_fingerprint"`
	Choices           []chunkChoice   `json:"choices"`
	Usage             json.RawMessage `json:"usage,omitempty"` // null on every chunk but the last when usage is asked for
}

type chunkChoice struct {
	Index        int             `json:"index"`
	Delta        map[string]any  `json:"delta"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

// sse writes server-sent events, flushing each.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (e sse) data(v any) bool {
	b, err := json.Marshal(v)
	if err != nil { // only our own types are written
		panic(fmt.Sprintf("sim: encoding chunk: %v", err))
	}
	return e.raw(b)
}

func (e sse) raw(b []byte) bool {
	buf := make([]byte, 0, len(b)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	if _, err := e.w.Write(buf); err != nil {
		return false
	}
	return e.rc.Flush() == nil
}

func startSSE(w http.ResponseWriter) sse {
	h := w.Header()
	h["Content-Type"] = []string{"text/event-stream; charset=utf-8"}
	h["Cache-Control"] = []string{"no-cache"}
	h.Set("x-request-id", "req_"+randomID(24))
	w.WriteHeader(http.StatusOK)
	e := sse{w: w, rc: http.NewResponseController(w)}
	_ = e.rc.Flush()
	return e
}

// streamCompletion answers an admitted streamed call in OpenAI's format:
// headers at once, then after TTFT a role chunk and one content chunk per
// token (PerToken apart), a finish chunk, the usage chunk when the request
// asked for it, and data: [DONE]. The text is the one the same request
// gets unstreamed. f is a stream fault (cut or stall) or noFault.
//
// The ledger records a completion once a token has been sent (the provider
// billed output), so a stream cut after its first token counts once and a
// stream cut before it counts nothing.
func (s *Server) streamCompletion(w http.ResponseWriter, r *http.Request, g *generation, m *modelState, c *call, e *entry, arrival int64, f fault) {
	if c.responses {
		s.streamResponse(w, r, g, m, c, e, arrival, f)
		return
	}
	completion := min(max(s.cfg.OutputTokens(c.maxOut, c.body), 0), c.maxOut)
	cc := s.newCompletion(c, completion, s.cfg.Now())
	m.peek(s.now()).set(w.Header(), s.form)
	out := startSSE(w)
	g.streamed.Add(1)
	s.count(g, m, http.StatusOK)
	pieces := s.filler.pieces(completion)
	if pad := s.cfg.PadResponseBytes; pad > 0 {
		pieces = append(pieces, strings.Repeat(".", pad))
	}
	stopAt := -1
	switch f {
	case faultStreamCut:
		stopAt = s.cfg.Faults.StreamCutAfter
	case faultStreamStall:
		stopAt = s.cfg.Faults.StreamStallAfter
	}
	var usage json.RawMessage
	if c.usage {
		usage = json.RawMessage("null")
	}
	mk := func(delta map[string]any, finish *string) chunk {
		return chunk{ID: cc.ID, Object: "chat.completion.chunk", Created: cc.Created, Model: cc.Model, ServiceTier: cc.ServiceTier,
			SystemFingerprint: cc.SystemFingerprint, Usage: usage, Choices: []chunkChoice{{Delta: delta, Logprobs: json.RawMessage("null"), FinishReason: finish}}}
	}
	content := func(p string) map[string]any { return map[string]any{"content": p} }
	if t := c.tool; t != nil {
		// A tool call: its arguments stream in two pieces.
		cut := len(t.args) / 2
		pieces = []string{t.args[:cut], t.args[cut:]}
		content = func(p string) map[string]any {
			return map[string]any{"tool_calls": []any{map[string]any{"index": 0, "function": map[string]any{"arguments": p}}}}
		}
	}
	sent := 0 // content chunks written
	// gone ends a stream whose client left, or that a fault ends: what was
	// sent was generated and billed.
	gone := func(clientLeft bool) {
		if sent > 0 {
			m.succeeded(arrival, c.cost, int64(c.prompt+min(sent, completion)))
			g.complete(c.key, c.jobID, nil, nil)
		}
		if clientLeft {
			g.clientGone.Add(1)
		}
		g.release(c.key, e)
	}
	if !sleep(r.Context(), s.cfg.TTFT) {
		gone(true)
		return
	}
	if !out.data(mk(map[string]any{"role": "assistant", "content": "", "refusal": nil}, nil)) {
		gone(true)
		return
	}
	if t := c.tool; t != nil && stopAt != 0 {
		if !out.data(mk(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "id": t.id, "type": "function",
			"function": map[string]any{"name": t.name, "arguments": ""}}}}, nil)) {
			gone(true)
			return
		}
	}
	for i, p := range pieces {
		if i == stopAt {
			break
		}
		if i > 0 && !sleep(r.Context(), s.cfg.PerToken) {
			gone(true)
			return
		}
		if !out.data(mk(content(p), nil)) {
			gone(true)
			return
		}
		sent++
	}
	switch {
	case f == faultStreamCut:
		g.streamCuts.Add(1)
		gone(false)
		dropConnection(w)
		return
	case f == faultStreamStall:
		g.streamStalls.Add(1)
		gone(false)
		hang(r.Context(), w, s.cfg.Faults.HangFor)
		return
	}
	finish := cc.Choices[0].FinishReason
	if !out.data(mk(map[string]any{}, &finish)) {
		gone(true)
		return
	}
	body, err := json.Marshal(cc)
	if err != nil {
		panic(fmt.Sprintf("sim: encoding completion: %v", err))
	}
	m.succeeded(arrival, c.cost, int64(c.prompt+completion))
	g.complete(c.key, c.jobID, e, body)
	if c.usage {
		u, _ := json.Marshal(cc.Usage)
		last := mk(nil, nil)
		last.Choices, last.Usage = []chunkChoice{}, u
		if !out.data(last) {
			g.clientGone.Add(1)
			return
		}
	}
	if !out.raw([]byte("[DONE]")) {
		g.clientGone.Add(1)
	}
}

// replayStream answers a streamed request from a stored completion (the
// idempotency ledger), without delays and without charging anything.
func (s *Server) replayStream(w http.ResponseWriter, g *generation, m *modelState, c *call, body []byte) {
	if c.responses {
		s.replayResponseStream(w, g, m, body)
		return
	}
	m.peek(s.now()).set(w.Header(), s.form)
	w.Header().Set("Idempotent-Replayed", "true")
	out := startSSE(w)
	g.replayed.Add(1)
	s.count(g, m, http.StatusOK)
	for _, ch := range job.CompletionChunks(body, c.usage) {
		if !out.raw(ch) {
			return
		}
	}
	out.raw([]byte("[DONE]"))
}

// pieces returns the first n words of filler as the chunks a stream sends
// them in: each word after the first with its leading space, so the pieces
// join into text(n).
func (f filler) pieces(n int) []string {
	out := make([]string, 0, n)
	for i := range n {
		k := i % fillerWords
		start := 0
		if k > 0 {
			start = f.ends[k-1] + 1
		}
		w := f.text0[start:f.ends[k]]
		if i > 0 {
			w = " " + w
		}
		out = append(out, w)
	}
	return out
}
