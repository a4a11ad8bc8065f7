package wire

import "encoding/json"

// NewAnthropicChunks starts the translation of one stream, its chunks
// stamped created (Unix seconds).
func NewAnthropicChunks(created int64) *AnthropicChunks {
	return &AnthropicChunks{created: created, tools: map[int]int{}}
}

// AnthropicChunks translates one Anthropic Messages stream into OpenAI
// chat.completion.chunk objects: a role chunk, content and tool-call
// deltas, a finish chunk and a usage chunk (always; a relay drops it when
// its client did not ask for usage).
type AnthropicChunks struct {
	id, model string
	created   int64
	usage     ChatUsage
	tools     map[int]int // content block index -> tool call index
}

func (t *AnthropicChunks) chunk(delta map[string]any, finish *string) []byte {
	b, _ := json.Marshal(map[string]any{"id": t.id, "object": "chat.completion.chunk", "created": t.created, "model": t.model,
		"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}})
	return b
}

// Event translates one event, given its SSE type and data, into the
// chunks it makes; done reports the end of the stream, and errBody, when
// not nil, is the OpenAI error body that ends it (an error event, or an
// event that cannot be read).
func (t *AnthropicChunks) Event(evType string, data []byte) (chunks [][]byte, done bool, errBody []byte) {
	var e struct {
		Type    string `json:"type"`
		Index   int    `json:"index"`
		Message struct {
			ID    string `json:"id"`
			Model string `json:"model"`
			Usage struct {
				InputTokens              int `json:"input_tokens"`
				OutputTokens             int `json:"output_tokens"`
				CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
				CacheReadInputTokens     int `json:"cache_read_input_tokens"`
			} `json:"usage"`
		} `json:"message"`
		ContentBlock struct {
			Type string `json:"type"`
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"content_block"`
		Delta struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			PartialJSON string `json:"partial_json"`
			StopReason  string `json:"stop_reason"`
		} `json:"delta"`
		Usage *struct {
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, false, []byte(`{"error":{"message":"undecodable stream event","type":"api_error"}}`)
	}
	typ := e.Type
	if typ == "" {
		typ = evType
	}
	switch typ {
	case "message_start":
		m := e.Message
		t.id, t.model = m.ID, m.Model
		u := m.Usage
		t.usage.PromptTokens = max(u.InputTokens+u.CacheCreationInputTokens+u.CacheReadInputTokens, 0)
		t.usage.PromptTokensDetails.CachedTokens = max(u.CacheReadInputTokens, 0)
		t.usage.CacheReadInputTokens = max(u.CacheReadInputTokens, 0)
		t.usage.CacheCreationInputTokens = max(u.CacheCreationInputTokens, 0)
		t.usage.CompletionTokens = max(u.OutputTokens, 0)
		return [][]byte{t.chunk(map[string]any{"role": "assistant", "content": ""}, nil)}, false, nil
	case "content_block_start":
		if e.ContentBlock.Type != "tool_use" {
			return nil, false, nil
		}
		n := len(t.tools)
		t.tools[e.Index] = n
		return [][]byte{t.chunk(map[string]any{"tool_calls": []any{map[string]any{"index": n, "id": e.ContentBlock.ID, "type": "function",
			"function": map[string]any{"name": e.ContentBlock.Name, "arguments": ""}}}}, nil)}, false, nil
	case "content_block_delta":
		switch e.Delta.Type {
		case "text_delta":
			return [][]byte{t.chunk(map[string]any{"content": e.Delta.Text}, nil)}, false, nil
		case "input_json_delta":
			n, ok := t.tools[e.Index]
			if !ok {
				return nil, false, nil
			}
			return [][]byte{t.chunk(map[string]any{"tool_calls": []any{map[string]any{"index": n, "function": map[string]any{"arguments": e.Delta.PartialJSON}}}}, nil)}, false, nil
		}
		return nil, false, nil // thinking and signature deltas have no OpenAI form
	case "message_delta":
		if e.Usage != nil {
			t.usage.CompletionTokens = max(e.Usage.OutputTokens, 0)
		}
		if e.Delta.StopReason == "" {
			return nil, false, nil
		}
		finish := AnthropicFinish(e.Delta.StopReason)
		t.usage.TotalTokens = t.usage.PromptTokens + t.usage.CompletionTokens
		u, _ := json.Marshal(map[string]any{"id": t.id, "object": "chat.completion.chunk", "created": t.created, "model": t.model, "choices": []any{}, "usage": t.usage})
		return [][]byte{t.chunk(map[string]any{}, &finish), u}, false, nil
	case "message_stop":
		return nil, true, nil
	case "error":
		if conv, ok := AnthropicErrorToOpenAI(data); ok {
			return nil, false, conv
		}
		return nil, false, []byte(`{"error":{"message":"error event","type":"api_error"}}`)
	}
	return nil, false, nil // ping, content_block_stop, and events added later
}
