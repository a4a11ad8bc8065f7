package sim

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The Messages API (POST /v1/messages), limited as Anthropic documents its
// limits (ProfileAnthropic; served under every profile):
//
//   - per model, three token buckets refilled continuously at limit/60 per
//     second and holding Config.BucketSeconds of refill (under this
//     profile by default 60, and always 60 under the others: a minute's
//     limit, as Anthropic's capacity is "continuously replenished up to
//     your maximum limit"), starting full:
//     requests (RPM), input tokens (ITPM) and output tokens (OTPM). A
//     request must fit all three when it arrives (one larger than a
//     bucket's capacity only into a full bucket);
//   - ITPM is charged input_tokens + cache_creation_input_tokens; cache
//     reads are free unless ModelLimits.CacheReadsCount;
//   - OTPM is charged max_tokens at arrival and given back what the answer
//     did not use when it ends;
//   - prompt caching: a prefix (tools, then system, then messages, up to a
//     block with cache_control) of at least MinCacheTokens that the
//     simulator answered within its TTL (5 minutes, or 1 hour with
//     "ttl":"1h"; refreshed on every read) is read from the cache; the
//     rest up to the last breakpoint is written to it once the answer is
//     sent. The longest warm breakpoint is read;
//   - tokens are counted independently of Sluice's tokenizer: characters/4
//     (rounded up) of each text block, tool definition and tool result, 3
//     per message, images by Anthropic's rule width × height / 750 (PNG
//     data; 1,600 for other images);
//   - every answer carries anthropic-ratelimit-{requests,input-tokens,
//     output-tokens,tokens}-{limit,remaining,reset} (reset: RFC 3339, when
//     the bucket is full again; tokens: the input or output bucket with the
//     less room), and a refusal is a 429 with retry-after (whole seconds)
//     and Anthropic's error body.
//
// Streaming, Idempotency-Key replays and faults are not simulated here.

// MinCacheTokens is the shortest prefix the simulator caches (Anthropic's
// minimum for most models).
const MinCacheTokens = 1024

// maxReceived bounds the request bodies Received keeps.
const maxReceived = 64

// MessagesStats are one model's counts on /v1/messages.
type MessagesStats struct {
	Requests, Admitted, RateLimited int64
	// RateLimitedBy counts refusals by bucket: requests, input_tokens,
	// output_tokens.
	RateLimitedBy map[string]int64
	// InputCharged is what ITPM was charged; Output what OTPM was charged
	// after the end-of-answer correction; CacheRead and CacheWrite are the
	// usage reported.
	InputCharged, OutputCharged, CacheRead, CacheWrite int64
	// Timeline is per second since the start (or Reset): charged at the
	// request's arrival.
	Timeline []MessagesSecond
}

// MessagesSecond is one second of a model's /v1/messages timeline.
type MessagesSecond struct {
	Admitted, RateLimited int64
	Input, Output         int64 // ITPM and OTPM charges (output as corrected)
}

// anthropicState is the Messages API's state within a generation.
type anthropicState struct {
	mu       sync.Mutex
	start    int64
	models   map[string]*anthropicModel
	cache    map[string]int64 // prefix hash → expiry (unix ns)
	received [][]byte
}

type anthropicModel struct {
	lim     ModelLimits
	buckets [3]*bucket // requests, input, output; nil when unlimited
	stats   MessagesStats
}

var bucketNames = [3]string{"requests", "input_tokens", "output_tokens"}

func newAnthropicState(start int64, c Config) *anthropicState {
	st := &anthropicState{start: start, models: map[string]*anthropicModel{}, cache: map[string]int64{}}
	ms := int64(60_000) // a minute's limit, under other profiles
	if c.Profile == ProfileAnthropic {
		ms = bucketMillis(c.BucketSeconds)
	}
	for _, m := range c.Models {
		st.models[m.Name] = &anthropicModel{lim: m, buckets: [3]*bucket{
			newBucket(int64(m.RPM), ms, start), newBucket(int64(m.ITPM), ms, start), newBucket(int64(m.OTPM), ms, start)},
			stats: MessagesStats{RateLimitedBy: map[string]int64{}}}
	}
	return st
}

// Messages returns a snapshot of the /v1/messages counts, by model.
func (s *Server) Messages() map[string]MessagesStats {
	st := s.anth.Load()
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make(map[string]MessagesStats, len(st.models))
	for name, m := range st.models {
		c := m.stats
		c.RateLimitedBy = make(map[string]int64, len(m.stats.RateLimitedBy))
		for k, v := range m.stats.RateLimitedBy {
			c.RateLimitedBy[k] = v
		}
		c.Timeline = append([]MessagesSecond(nil), m.stats.Timeline...)
		out[name] = c
	}
	return out
}

// Received returns the last request bodies /v1/messages received (at most
// 64, oldest first), as they arrived.
func (s *Server) Received() [][]byte {
	st := s.anth.Load()
	st.mu.Lock()
	defer st.mu.Unlock()
	return append([][]byte(nil), st.received...)
}

type anBody struct {
	Model     string            `json:"model"`
	MaxTokens *int              `json:"max_tokens"`
	System    json.RawMessage   `json:"system"`
	Messages  []anBodyMessage   `json:"messages"`
	Tools     []json.RawMessage `json:"tools"`
	Stream    bool              `json:"stream"`
	Thinking  *struct {
		Type         string `json:"type"`
		BudgetTokens int    `json:"budget_tokens"`
	} `json:"thinking"`
}

type anBodyMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anBodyBlock struct {
	Type         string          `json:"type"`
	Text         string          `json:"text"`
	Content      json.RawMessage `json:"content"`
	Input        json.RawMessage `json:"input"`
	Source       *anBodySource   `json:"source"`
	CacheControl *struct {
		TTL string `json:"ttl"`
	} `json:"cache_control"`
}

type anBodySource struct {
	Type string `json:"type"`
	Data string `json:"data"`
}

// cacheBlock is one block of the cacheable sequence: its tokens, and its
// TTL when it is a breakpoint.
type cacheBlock struct {
	raw    []byte
	tokens int
	ttl    time.Duration // > 0 on a breakpoint
	image  bool          // counted by Anthropic's image rule, not scaled
}

// messagesCall is a parsed /v1/messages request.
type messagesCall struct {
	model   string
	maxOut  int
	blocks  []cacheBlock
	prompt  int
	read    int      // tokens read from the cache
	write   int      // tokens written to it
	writes  []string // prefix hashes written (each breakpoint's)
	ttls    []time.Duration
	readKey string
	readTTL time.Duration
	stream  bool // answered as Anthropic's event stream (streamMessage)
}

func anthropicErr(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
}

// serveMessages answers POST /v1/messages.
func (s *Server) serveMessages(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		anthropicErr(w, http.StatusMethodNotAllowed, "invalid_request_error", "use POST")
		return
	}
	st := s.anth.Load()
	if len(s.keys) > 0 {
		key := r.Header.Get("X-Api-Key")
		if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && key == "" {
			key = strings.TrimSpace(b)
		}
		if !s.keys[key] {
			anthropicErr(w, http.StatusUnauthorized, "authentication_error", "invalid x-api-key")
			return
		}
	}
	if r.Header.Get("Anthropic-Version") == "" {
		anthropicErr(w, http.StatusBadRequest, "invalid_request_error", "anthropic-version: header is required")
		return
	}
	arrived := s.now()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		anthropicErr(w, http.StatusBadRequest, "invalid_request_error", "could not read the request body")
		return
	}
	st.mu.Lock()
	st.received = append(st.received, body)
	if len(st.received) > maxReceived {
		st.received = append(st.received[:0], st.received[len(st.received)-maxReceived:]...)
	}
	st.mu.Unlock()
	c, err := parseMessages(body, s.cfg.Count)
	if err != nil {
		anthropicErr(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	m := st.models[c.model]
	if m == nil {
		anthropicErr(w, http.StatusNotFound, "not_found_error", "model: "+c.model)
		return
	}
	ok, wait, dim := st.admit(m, c, arrived)
	s.anthropicHeaders(w.Header(), m, arrived)
	if !ok {
		setRetryAfter(w.Header(), wait)
		w.Header().Del("Retry-After-Ms") // Anthropic sends retry-after only
		limit := []int{m.lim.RPM, m.lim.ITPM, m.lim.OTPM}[dim]
		what := []string{"requests", "input tokens", "output tokens"}[dim]
		anthropicErr(w, http.StatusTooManyRequests, "rate_limit_error",
			fmt.Sprintf("This request would exceed the rate limit for your organization (sim) of %s %s per minute. For details, refer to: https://docs.anthropic.com/en/api/rate-limits.", comma(limit), what))
		return
	}
	out := min(max(s.cfg.OutputTokens(c.maxOut, body), 0), c.maxOut)
	delivered := sleep(r.Context(), s.cfg.TTFT+time.Duration(out)*s.cfg.PerToken)
	st.finish(m, c, out, arrived, s.now())
	if !delivered {
		return
	}
	resp := s.message(c, body, out)
	w.Header().Set("Request-Id", "req_"+randomID(24))
	if c.stream {
		s.streamMessage(w, resp)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// message is the Messages API answer to c (its body) with out output
// tokens.
func (s *Server) message(c *messagesCall, body []byte, out int) map[string]any {
	input := c.prompt - c.read - c.write
	resp := map[string]any{
		"id": "msg_" + randomID(24), "type": "message", "role": "assistant", "model": c.model,
		"content":     []map[string]any{{"type": "text", "text": s.filler.text(out)}},
		"stop_reason": "end_turn", "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": input, "output_tokens": out,
			"cache_creation_input_tokens": c.write, "cache_read_input_tokens": c.read},
	}
	if out >= c.maxOut {
		resp["stop_reason"] = "max_tokens"
	}
	if t := s.anthropicTool(body); t != nil {
		resp["content"] = []map[string]any{{"type": "tool_use", "id": t.id, "name": t.name, "input": json.RawMessage(t.args)}}
		resp["stop_reason"] = "tool_use"
	}
	return resp
}

// parseMessages reads a Messages API body and counts its tokens: each
// block at characters/4 (images by Anthropic's rule), scaled by count's
// Factor, so a test can have the provider count above or below Sluice's
// estimate as Anthropic's own tokenizer does.
func parseMessages(body []byte, count TokenCount) (*messagesCall, error) {
	var in anBody
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, fmt.Errorf("malformed body: %v", err)
	}
	switch {
	case in.Model == "":
		return nil, fmt.Errorf("model: Field required")
	case in.MaxTokens == nil || *in.MaxTokens < 1:
		return nil, fmt.Errorf("max_tokens: Field required (at least 1)")
	case len(in.Messages) == 0:
		return nil, fmt.Errorf("messages: at least one message is required")
	}
	if t := in.Thinking; t != nil && t.Type == "enabled" && (t.BudgetTokens < 1024 || t.BudgetTokens >= *in.MaxTokens) {
		return nil, fmt.Errorf("thinking.budget_tokens: must be ≥ 1024 and less than max_tokens")
	}
	c := &messagesCall{model: in.Model, maxOut: *in.MaxTokens, stream: in.Stream}
	for _, t := range in.Tools {
		var b anBodyBlock
		_ = json.Unmarshal(t, &b)
		c.blocks = append(c.blocks, cacheBlock{raw: t, tokens: charTokens(string(t)), ttl: ttlOf(b)})
	}
	if sys := bytes.TrimSpace(in.System); len(sys) > 0 && string(sys) != "null" {
		var s string
		if json.Unmarshal(sys, &s) == nil {
			c.blocks = append(c.blocks, cacheBlock{raw: sys, tokens: charTokens(s)})
		} else {
			var blocks []json.RawMessage
			if json.Unmarshal(sys, &blocks) != nil {
				return nil, fmt.Errorf("system: must be a string or an array of text blocks")
			}
			for _, raw := range blocks {
				c.blocks = append(c.blocks, block(raw))
			}
		}
	}
	for i, m := range in.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, fmt.Errorf("messages[%d].role: must be user or assistant", i)
		}
		c.prompt += 3
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			c.blocks = append(c.blocks, cacheBlock{raw: m.Content, tokens: charTokens(s)})
			continue
		}
		var blocks []json.RawMessage
		if json.Unmarshal(m.Content, &blocks) != nil {
			return nil, fmt.Errorf("messages[%d].content: must be a string or an array of blocks", i)
		}
		for _, raw := range blocks {
			c.blocks = append(c.blocks, block(raw))
		}
	}
	for i := range c.blocks {
		if !c.blocks[i].image {
			c.blocks[i].tokens = count.scale(c.blocks[i].tokens)
		}
		c.prompt += c.blocks[i].tokens
	}
	return c, nil
}

// block reads one content block: its tokens and breakpoint.
func block(raw json.RawMessage) cacheBlock {
	var b anBodyBlock
	_ = json.Unmarshal(raw, &b)
	n := 0
	switch b.Type {
	case "text":
		n = charTokens(b.Text)
	case "image":
		n = imageTokens(b.Source)
	case "tool_use":
		n = charTokens(string(b.Input))
	case "tool_result":
		n = charTokens(string(b.Content))
	default:
		n = charTokens(string(raw))
	}
	return cacheBlock{raw: raw, tokens: n, ttl: ttlOf(b), image: b.Type == "image"}
}

func ttlOf(b anBodyBlock) time.Duration {
	switch {
	case b.CacheControl == nil:
		return 0
	case b.CacheControl.TTL == "1h":
		return time.Hour
	}
	return 5 * time.Minute
}

// imageTokens is width × height / 750 for base64 PNG data, else 1,600.
func imageTokens(src *anBodySource) int {
	if src != nil && src.Type == "base64" {
		head, err := base64.StdEncoding.DecodeString(src.Data[:min(len(src.Data), 32)])
		if err == nil && len(head) >= 24 && bytes.HasPrefix(head, []byte("\x89PNG")) {
			w, h := binary.BigEndian.Uint32(head[16:20]), binary.BigEndian.Uint32(head[20:24])
			return max(int(math.Ceil(float64(w)*float64(h)/750)), 1)
		}
	}
	return 1600
}

// admit decides an arrival: the cache it would read and write, then the
// three buckets. dim is the bucket that refused.
func (st *anthropicState) admit(m *anthropicModel, c *messagesCall, now int64) (ok bool, wait time.Duration, dim int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	h := sha256.New()
	h.Write([]byte(c.model + "\x00"))
	tokens := 0
	for _, b := range c.blocks {
		h.Write(b.raw)
		h.Write([]byte{0})
		tokens += b.tokens
		if b.ttl == 0 || tokens < MinCacheTokens {
			continue
		}
		key := string(h.Sum(nil))
		if exp, warm := st.cache[key]; warm && exp > now {
			c.read, c.readKey, c.readTTL = tokens, key, b.ttl
			c.writes, c.ttls = nil, nil
		} else {
			c.writes, c.ttls = append(c.writes, key), append(c.ttls, b.ttl)
		}
		c.write = tokens - c.read
	}
	m.stats.Requests++
	sec := m.second(st.start, now)
	input := int64(c.prompt - c.read)
	if m.lim.CacheReadsCount {
		input = int64(c.prompt)
	}
	costs := [3]int64{1, input, int64(c.maxOut)}
	refused := false
	for d, b := range m.buckets {
		if b == nil {
			continue
		}
		b.refill(now)
		if !b.fits(units(costs[d])) {
			if w := b.wait(units(costs[d]), now); !refused || w > wait {
				wait, dim = w, d
			}
			refused = true
		}
	}
	if refused {
		m.stats.RateLimited++
		m.stats.RateLimitedBy[bucketNames[dim]]++
		if sec != nil {
			sec.RateLimited++
		}
		return false, max(wait, time.Millisecond), dim
	}
	for d, b := range m.buckets {
		if b != nil {
			b.take(units(costs[d]))
		}
	}
	if c.readKey != "" {
		// A read refreshes the entry's TTL.
		st.cache[c.readKey] = max(st.cache[c.readKey], now+int64(c.readTTL))
	}
	m.stats.Admitted++
	m.stats.InputCharged += input
	m.stats.OutputCharged += int64(c.maxOut)
	m.stats.CacheRead += int64(c.read)
	m.stats.CacheWrite += int64(c.write)
	if sec != nil {
		sec.Admitted++
		sec.Input += input
		sec.Output += int64(c.maxOut)
	}
	return true, 0, 0
}

// finish ends an admitted call that produced out tokens: the output bucket
// gets back what max_tokens reserved beyond them, and the prefixes it wrote
// become readable (Anthropic: once the answer starts).
func (st *anthropicState) finish(m *anthropicModel, c *messagesCall, out int, arrived, now int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	back := int64(c.maxOut - out)
	if b := m.buckets[2]; b != nil && back > 0 {
		b.refill(now)
		b.level = min(b.cap, b.level+units(back))
	}
	m.stats.OutputCharged -= back
	if sec := m.second(st.start, arrived); sec != nil {
		sec.Output -= back
	}
	for i, key := range c.writes {
		st.cache[key] = max(st.cache[key], now+int64(c.ttls[i]))
	}
	if len(st.cache) > 4096 {
		for k, exp := range st.cache {
			if exp <= now {
				delete(st.cache, k)
			}
		}
	}
}

func (m *anthropicModel) second(start, at int64) *MessagesSecond {
	i := max((at-start)/int64(time.Second), 0)
	if i >= maxTimeline {
		return nil
	}
	if n := int64(len(m.stats.Timeline)); n <= i {
		m.stats.Timeline = append(m.stats.Timeline, make([]MessagesSecond, i+1-n)...)
	}
	return &m.stats.Timeline[i]
}

// anthropicHeaders sets Anthropic's rate-limit headers from the buckets.
func (s *Server) anthropicHeaders(h http.Header, m *anthropicModel, now int64) {
	st := s.anth.Load()
	st.mu.Lock()
	defer st.mu.Unlock()
	limits := [3]int{m.lim.RPM, m.lim.ITPM, m.lim.OTPM}
	names := [3]string{"Requests", "Input-Tokens", "Output-Tokens"}
	tightest, room := -1, math.Inf(1)
	for d, b := range m.buckets {
		if b == nil {
			continue
		}
		b.refill(now)
		rem := b.level / unitsPerToken
		full := time.Unix(0, now).Add(b.wait(b.cap, now)).UTC().Format(time.RFC3339)
		h.Set("Anthropic-Ratelimit-"+names[d]+"-Limit", strconv.Itoa(limits[d]))
		h.Set("Anthropic-Ratelimit-"+names[d]+"-Remaining", strconv.FormatInt(rem, 10))
		h.Set("Anthropic-Ratelimit-"+names[d]+"-Reset", full)
		if f := float64(b.level) / float64(b.cap); d > 0 && f < room {
			tightest, room = d, f
		}
	}
	if tightest > 0 {
		for _, k := range []string{"Limit", "Remaining", "Reset"} {
			h.Set("Anthropic-Ratelimit-Tokens-"+k, h.Get("Anthropic-Ratelimit-"+names[tightest]+"-"+k))
		}
	}
}

// comma writes n with thousands separators, as Anthropic's messages do.
func comma(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
