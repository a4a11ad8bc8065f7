package provider

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Prompt caching and extended thinking on the Messages API: the caller's
// cache_control breakpoints (on content parts, tools, or a whole message,
// which marks its last block) and its thinking object reach Anthropic as
// sent; they change what Anthropic charges, so dropping them would make
// every cached call cost its full prompt against the input-tokens limit.

// present returns raw, or nil when it is absent or JSON null.
func present(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

// markLast sets a message-level breakpoint on the message's last block,
// unless that block has its own.
func markLast(blocks []anBlock, cc json.RawMessage) []anBlock {
	if cc = present(cc); cc != nil && len(blocks) > 0 && blocks[len(blocks)-1].CacheControl == nil {
		blocks[len(blocks)-1].CacheControl = cc
	}
	return blocks
}

// systemPrompt is the system prompt as a string, or as text blocks when
// one carries a breakpoint (a string cannot).
func systemPrompt(blocks []anBlock) any {
	if len(blocks) == 0 {
		return nil
	}
	texts := make([]string, len(blocks))
	for i, b := range blocks {
		if b.CacheControl != nil {
			return blocks
		}
		texts[i] = b.Text
	}
	return strings.Join(texts, "\n\n")
}
