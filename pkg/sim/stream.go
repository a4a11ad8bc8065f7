package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

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
	run := s.newStreamRun(w, r, g, m, c, e, arrival, f)
	cc := s.newCompletion(c, run.completion, s.cfg.Now())
	m.peek(s.now()).set(w.Header(), s.form)
	out := startSSE(w)
	g.streamed.Add(1)
	s.count(g, m, http.StatusOK)
	var usage json.RawMessage
	if c.usage {
		usage = json.RawMessage("null")
	}
	mk := func(delta map[string]any, finish *string) chunk {
		return chunk{ID: cc.ID, Object: "chat.completion.chunk", Created: cc.Created, Model: cc.Model, ServiceTier: cc.ServiceTier,
			SystemFingerprint: cc.SystemFingerprint, Usage: usage, Choices: []chunkChoice{{Delta: delta, Logprobs: json.RawMessage("null"), FinishReason: finish}}}
	}
	pieces, delta := run.pieces(), func(p string) map[string]any { return map[string]any{"content": p} }
	var head map[string]any
	if t := c.tool; t != nil {
		head, pieces, delta = t.chatDeltas()
	}
	if !sleep(r.Context(), s.cfg.TTFT) || !out.data(mk(map[string]any{"role": "assistant", "content": "", "refusal": nil}, nil)) ||
		head != nil && run.stopAt != 0 && !out.data(mk(head, nil)) {
		run.gone(true)
		return
	}
	if !run.send(pieces, func(p string) bool { return out.data(mk(delta(p), nil)) }) || run.faulted() {
		return
	}
	finish := cc.Choices[0].FinishReason
	if !out.data(mk(map[string]any{}, &finish)) {
		run.gone(true)
		return
	}
	body, err := json.Marshal(cc)
	if err != nil {
		panic(fmt.Sprintf("sim: encoding completion: %v", err))
	}
	run.finished(body)
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

// streamRun is one admitted streamed call as it goes: how much of its
// answer it sent, and how it ends.
type streamRun struct {
	s          *Server
	w          http.ResponseWriter
	r          *http.Request
	g          *generation
	m          *modelState
	c          *call
	e          *entry
	arrival    int64
	f          fault
	completion int // output tokens of the whole answer
	stopAt     int // the piece a stream fault stops before (-1: none)
	sent       int // pieces written
}

func (s *Server) newStreamRun(w http.ResponseWriter, r *http.Request, g *generation, m *modelState, c *call, e *entry, arrival int64, f fault) *streamRun {
	run := &streamRun{s: s, w: w, r: r, g: g, m: m, c: c, e: e, arrival: arrival, f: f, stopAt: -1,
		completion: min(max(s.cfg.OutputTokens(c.maxOut, c.body), 0), c.maxOut)}
	switch f {
	case faultStreamCut:
		run.stopAt = s.cfg.Faults.StreamCutAfter
	case faultStreamStall:
		run.stopAt = s.cfg.Faults.StreamStallAfter
	}
	return run
}

// pieces is the answer's text as a stream sends it, word by word.
func (run *streamRun) pieces() []string {
	if c := run.c.content; c != nil {
		cut := len(*c) / 2
		for cut > 0 && !utf8.RuneStart((*c)[cut]) {
			cut--
		}
		return []string{(*c)[:cut], (*c)[cut:]}
	}
	pieces := run.s.filler.pieces(run.completion)
	if pad := run.s.cfg.PadResponseBytes; pad > 0 {
		pieces = append(pieces, strings.Repeat(".", pad))
	}
	return pieces
}

// send writes pieces PerToken apart, up to the fault's stop; it reports
// false when the client left (the stream is then ended).
func (run *streamRun) send(pieces []string, write func(p string) bool) bool {
	for i, p := range pieces {
		if i == run.stopAt {
			break
		}
		if i > 0 && !sleep(run.r.Context(), run.s.cfg.PerToken) || !write(p) {
			run.gone(true)
			return false
		}
		run.sent++
	}
	return true
}

// faulted ends a stream its fault cuts or stalls, and reports whether it
// did.
func (run *streamRun) faulted() bool {
	switch run.f {
	case faultStreamCut:
		run.g.streamCuts.Add(1)
		run.gone(false)
		dropConnection(run.w)
	case faultStreamStall:
		run.g.streamStalls.Add(1)
		run.gone(false)
		hang(run.r.Context(), run.w, run.s.cfg.Faults.HangFor)
	default:
		return false
	}
	return true
}

// gone ends a stream whose client left, or that a fault ends: what was
// sent was generated and billed.
func (run *streamRun) gone(clientLeft bool) {
	c := run.c
	if run.sent > 0 {
		run.m.succeeded(run.arrival, c.cost, int64(c.prompt+min(run.sent, run.completion)))
		run.g.complete(c.key, c.jobID, nil, nil)
	}
	if clientLeft {
		run.g.clientGone.Add(1)
	}
	run.g.release(c.key, run.e)
}

// finished records the whole answer, body, as completed.
func (run *streamRun) finished(body []byte) {
	run.m.succeeded(run.arrival, run.c.cost, int64(run.c.prompt+run.completion))
	run.g.complete(run.c.key, run.c.jobID, run.e, body)
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
