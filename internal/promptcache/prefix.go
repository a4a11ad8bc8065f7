// Package promptcache budgets Anthropic's prompt caching: it finds a
// request's cacheable prefix (Prefix) and keeps, for the whole fleet, the
// prefixes the provider recently wrote to its cache (Registry), so that
// admission reserves a request whose prefix is warm net of the tokens the
// provider will read from its cache: Anthropic does not count them toward
// its input-tokens limit.
package promptcache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/sluice-dev/sluice/pkg/tokens"
)

// TTLs Anthropic offers for a cache entry (cache_control.ttl), refreshed on
// every read.
const (
	TTLShort = 5 * time.Minute
	TTLLong  = time.Hour
)

// perMessage approximates the tokens a message's framing adds.
const perMessage = 4

// Prefix is a request's cacheable prefix: everything up to its last
// cache_control breakpoint, in the order the Messages API caches it (tools,
// then system, then messages).
type Prefix struct {
	// Hash identifies the prefix's content and model (hex SHA-256).
	Hash string
	// Tokens is Sluice's estimate of the prefix's tokens, made as the
	// prompt's estimate is (tokens.Prompt).
	Tokens int
	// TTL is the last breakpoint's: TTLShort or TTLLong.
	TTL time.Duration
}

type chatBody struct {
	Model    string            `json:"model"`
	Messages []chatMessage     `json:"messages"`
	Tools    []json.RawMessage `json:"tools"`
}

type chatMessage struct {
	Role         string          `json:"role"`
	Content      json.RawMessage `json:"content"`
	CacheControl *cacheControl   `json:"cache_control"`
}

type cacheControl struct {
	Type string `json:"type"`
	TTL  string `json:"ttl"`
}

type part struct {
	Type         string        `json:"type"`
	Text         string        `json:"text"`
	CacheControl *cacheControl `json:"cache_control"`
}

type tool struct {
	CacheControl *cacheControl `json:"cache_control"`
}

// block is one cacheable unit: a tool, or a message's content part.
type block struct {
	kind, role string
	raw        []byte
	text       string
	bp         *cacheControl // set on a breakpoint
	newMessage bool
}

// Of returns the cacheable prefix of an OpenAI-shaped chat body that
// carries cache_control breakpoints (on content parts, tools or whole
// messages, as the Anthropic client forwards them); ok is false when it
// has none or cannot be read. It never panics, whatever the body.
func Of(body []byte) (p Prefix, ok bool) {
	if !bytes.Contains(body, []byte(`"cache_control"`)) {
		return Prefix{}, false
	}
	var in chatBody
	if json.Unmarshal(body, &in) != nil {
		return Prefix{}, false
	}
	var blocks []block
	for _, t := range in.Tools {
		var tl tool
		_ = json.Unmarshal(t, &tl)
		blocks = append(blocks, block{kind: "tool", raw: t, text: string(t), bp: tl.CacheControl})
	}
	// The Messages API takes system and developer messages as its system
	// prompt, ahead of the conversation.
	for _, system := range []bool{true, false} {
		for _, m := range in.Messages {
			if (m.Role == "system" || m.Role == "developer") != system {
				continue
			}
			blocks = append(blocks, messageBlocks(m)...)
		}
	}
	last := -1
	for i, b := range blocks {
		if b.bp != nil {
			last = i
		}
	}
	if last < 0 {
		return Prefix{}, false
	}
	h := sha256.New()
	h.Write([]byte("prefix/1\x00" + in.Model + "\x00"))
	n := 0
	for _, b := range blocks[:last+1] {
		h.Write([]byte(b.kind + "\x00" + b.role + "\x00"))
		h.Write(b.raw)
		h.Write([]byte{0})
		n += tokens.Count(in.Model, b.text)
		if b.newMessage {
			n += perMessage
		}
	}
	if _, exact := tokens.Encoding(in.Model); !exact {
		n = int(float64(n)*tokens.FallbackFactor + 0.999) // as the prompt's estimate is
	}
	p = Prefix{Hash: hex.EncodeToString(h.Sum(nil)), Tokens: n, TTL: TTLShort}
	if blocks[last].bp.TTL == "1h" {
		p.TTL = TTLLong
	}
	return p, true
}

// messageBlocks splits a message into its parts; a breakpoint on the
// message marks its last part.
func messageBlocks(m chatMessage) []block {
	raw := bytes.TrimSpace(m.Content)
	var out []block
	var s string
	if json.Unmarshal(raw, &s) == nil {
		out = append(out, block{kind: "text", role: m.Role, raw: raw, text: s})
	} else {
		var parts []json.RawMessage
		if json.Unmarshal(raw, &parts) != nil {
			return nil
		}
		for _, pr := range parts {
			var p part
			_ = json.Unmarshal(pr, &p)
			out = append(out, block{kind: "part", role: m.Role, raw: pr, text: p.Text, bp: p.CacheControl})
		}
	}
	if len(out) == 0 {
		return nil
	}
	out[0].newMessage = true
	if m.CacheControl != nil {
		out[len(out)-1].bp = m.CacheControl
	}
	return out
}
