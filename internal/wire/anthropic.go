package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// OpenAI chat completions <-> Anthropic's Messages API, for an Anthropic
// provider: the executor's client sends every job's chat body as a
// Messages request (ChatToAnthropic) and reads the answer as chat
// (AnthropicToChat, AnthropicErrorToOpenAI).
//
// Prompt caching and extended thinking on the Messages API: the caller's
// cache_control breakpoints (on content parts, tools, or a whole message,
// which marks its last block) and its thinking object reach Anthropic as
// sent; they change what Anthropic charges, so dropping them would make
// every cached call cost its full prompt against the input-tokens limit.

// DefaultAnthropicMaxTokens is sent when the chat body names no
// max_tokens / max_completion_tokens (the Messages API requires one).
const DefaultAnthropicMaxTokens = 1024

// --- request conversion ---

type oaRequest struct {
	Model               string          `json:"model"`
	Messages            []oaMessage     `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Stop                json.RawMessage `json:"stop"`
	Tools               []oaTool        `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	User                string          `json:"user"`
	Stream              bool            `json:"stream"`
	N                   *int            `json:"n"`
	// Thinking is Anthropic's extended thinking, passed through as sent.
	Thinking json.RawMessage `json:"thinking"`
}

type oaMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []ChatToolCall  `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
	// CacheControl on a message marks its last block as a prompt-cache
	// breakpoint; on a part or a tool, that part or tool. Passed through.
	CacheControl json.RawMessage `json:"cache_control"`
}

type oaTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
	CacheControl json.RawMessage `json:"cache_control"`
}

type oaPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url"`
	CacheControl json.RawMessage `json:"cache_control"`
}

type anRequest struct {
	Model         string          `json:"model"`
	MaxTokens     int             `json:"max_tokens"`
	System        any             `json:"system,omitempty"` // a string, or text blocks with cache_control
	Messages      []anMessage     `json:"messages"`
	Temperature   *float64        `json:"temperature,omitempty"`
	TopP          *float64        `json:"top_p,omitempty"`
	StopSequences []string        `json:"stop_sequences,omitempty"`
	Tools         []anTool        `json:"tools,omitempty"`
	ToolChoice    map[string]any  `json:"tool_choice,omitempty"`
	Metadata      *anMetadata     `json:"metadata,omitempty"`
	Stream        bool            `json:"stream,omitempty"`
	Thinking      json.RawMessage `json:"thinking,omitempty"`
}

type anMessage struct {
	Role    string    `json:"role"`
	Content []anBlock `json:"content"`
}

type anBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	Source    *anSource       `json:"source,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   string          `json:"content,omitempty"`
	// CacheControl marks a prompt-cache breakpoint, as the caller sent it.
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
}

type anSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

type anTool struct {
	Name         string          `json:"name"`
	Description  string          `json:"description,omitempty"`
	InputSchema  json.RawMessage `json:"input_schema"`
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
}

type anMetadata struct {
	UserID string `json:"user_id"`
}

// errMalformed hides json's error text, which can quote request content.
var errMalformed = errors.New("malformed chat-completions body")

// ChatToAnthropic converts an OpenAI chat-completions body to a Messages API
// body. System and developer messages become the system prompt; tool calls
// and tool results become tool_use / tool_result blocks; consecutive
// messages of one role are merged. Errors never quote request content.
func ChatToAnthropic(body []byte, model string) ([]byte, error) {
	body, err := ForChat(body)
	if err != nil {
		return nil, err
	}
	var in oaRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, errMalformed
	}
	if in.Stream {
		return nil, errors.New("streaming is not supported")
	}
	if in.N != nil && *in.N > 1 {
		return nil, errors.New("n > 1 is not supported: the Messages API returns one completion per call")
	}
	out := anRequest{Model: in.Model, MaxTokens: DefaultAnthropicMaxTokens, Temperature: in.Temperature, TopP: in.TopP, Thinking: present(in.Thinking)}
	if model != "" {
		out.Model = model
	}
	if out.Model == "" {
		return nil, errors.New("model is required")
	}
	switch {
	case in.MaxCompletionTokens != nil:
		out.MaxTokens = *in.MaxCompletionTokens
	case in.MaxTokens != nil:
		out.MaxTokens = *in.MaxTokens
	}
	if in.User != "" {
		out.Metadata = &anMetadata{UserID: in.User}
	}
	stops, err := parseStop(in.Stop)
	if err != nil {
		return nil, err
	}
	out.StopSequences = stops

	system, msgs, err := anthropicMessages(in.Messages)
	if err != nil {
		return nil, err
	}
	out.Messages = msgs
	out.System = systemPrompt(system)
	if len(out.Messages) == 0 {
		return nil, errors.New("no user or assistant messages")
	}

	for i, t := range in.Tools {
		if t.Type != "" && t.Type != "function" {
			return nil, fmt.Errorf("tools[%d]: type %q is not supported", i, clip.String(t.Type, 32))
		}
		schema := t.Function.Parameters
		if len(bytes.TrimSpace(schema)) == 0 || string(bytes.TrimSpace(schema)) == "null" {
			schema = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		out.Tools = append(out.Tools, anTool{Name: t.Function.Name, Description: t.Function.Description, InputSchema: schema, CacheControl: present(t.CacheControl)})
	}
	if out.ToolChoice, err = toolChoice(in.ToolChoice); err != nil {
		return nil, err
	}
	if in.ParallelToolCalls != nil && !*in.ParallelToolCalls && len(out.Tools) > 0 {
		if out.ToolChoice == nil {
			out.ToolChoice = map[string]any{"type": "auto"}
		}
		if out.ToolChoice["type"] != "none" {
			out.ToolChoice["disable_parallel_tool_use"] = true
		}
	}
	return json.Marshal(out)
}

// anthropicMessages converts chat messages to the system prompt's blocks
// and Messages API messages (consecutive messages of one role merged).
func anthropicMessages(in []oaMessage) (system []anBlock, msgs []anMessage, err error) {
	for i, m := range in {
		var role string
		var blocks []anBlock
		switch m.Role {
		case "system", "developer":
			parts, err := contentBlocks(m.Content, false)
			if err != nil {
				return nil, nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			system = append(system, markLast(parts, m.CacheControl)...)
			continue
		case "user":
			role = "user"
			if blocks, err = contentBlocks(m.Content, true); err != nil {
				return nil, nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
		case "assistant":
			role = "assistant"
			if blocks, err = contentBlocks(m.Content, false); err != nil {
				return nil, nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			for j, tc := range m.ToolCalls {
				input := json.RawMessage(`{}`)
				if a := strings.TrimSpace(tc.Function.Arguments); a != "" {
					if !json.Valid([]byte(a)) {
						return nil, nil, fmt.Errorf("messages[%d].tool_calls[%d]: arguments are not JSON", i, j)
					}
					input = json.RawMessage(a)
				}
				blocks = append(blocks, anBlock{Type: "tool_use", ID: tc.ID, Name: tc.Function.Name, Input: input})
			}
		case "tool":
			role = "user"
			parts, err := contentBlocks(m.Content, false)
			if err != nil {
				return nil, nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			var text strings.Builder
			for _, p := range parts {
				text.WriteString(p.Text)
			}
			blocks = []anBlock{{Type: "tool_result", ToolUseID: m.ToolCallID, Content: text.String()}}
		default:
			return nil, nil, fmt.Errorf("messages[%d]: role %q is not supported", i, clip.String(m.Role, 32))
		}
		blocks = markLast(blocks, m.CacheControl)
		if len(blocks) == 0 {
			continue
		}
		if n := len(msgs); n > 0 && msgs[n-1].Role == role {
			msgs[n-1].Content = append(msgs[n-1].Content, blocks...)
		} else {
			msgs = append(msgs, anMessage{Role: role, Content: blocks})
		}
	}
	return system, msgs, nil
}

// contentBlocks converts OpenAI content (a string or an array of parts) to
// Anthropic blocks, dropping empty text (the Messages API rejects it).
func contentBlocks(raw json.RawMessage, images bool) ([]anBlock, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil, nil
		}
		return []anBlock{{Type: "text", Text: s}}, nil
	}
	var parts []oaPart
	if json.Unmarshal(raw, &parts) != nil {
		return nil, errors.New("content must be a string or an array of parts")
	}
	var out []anBlock
	for j, p := range parts {
		switch p.Type {
		case "text":
			if p.Text != "" {
				out = append(out, anBlock{Type: "text", Text: p.Text, CacheControl: present(p.CacheControl)})
			}
		case "image_url":
			if !images || p.ImageURL == nil {
				return nil, fmt.Errorf("content[%d]: image not allowed here", j)
			}
			src, err := imageSource(p.ImageURL.URL)
			if err != nil {
				return nil, fmt.Errorf("content[%d]: %w", j, err)
			}
			out = append(out, anBlock{Type: "image", Source: src, CacheControl: present(p.CacheControl)})
		default:
			return nil, fmt.Errorf("content[%d]: part type %q is not supported", j, clip.String(p.Type, 32))
		}
	}
	return out, nil
}

// imageSource converts an image_url (a data: URL or an http(s) URL).
func imageSource(u string) (*anSource, error) {
	if rest, ok := strings.CutPrefix(u, "data:"); ok {
		meta, data, ok := strings.Cut(rest, ",")
		mediaType, isB64 := strings.CutSuffix(meta, ";base64")
		if !ok || !isB64 || mediaType == "" {
			return nil, errors.New("image data URL must be base64")
		}
		return &anSource{Type: "base64", MediaType: mediaType, Data: data}, nil
	}
	if strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://") {
		return &anSource{Type: "url", URL: u}, nil
	}
	return nil, errors.New("image URL must be a data: or http(s) URL")
}

func parseStop(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) != nil {
		return nil, errors.New("stop must be a string or an array of strings")
	}
	return ss, nil
}

func toolChoice(raw json.RawMessage) (map[string]any, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto":
			return map[string]any{"type": "auto"}, nil
		case "required":
			return map[string]any{"type": "any"}, nil
		case "none":
			return map[string]any{"type": "none"}, nil
		}
		return nil, fmt.Errorf("tool_choice %q is not supported", clip.String(s, 32))
	}
	var obj struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &obj) != nil || obj.Type != "function" || obj.Function.Name == "" {
		return nil, errors.New("tool_choice must name a function")
	}
	return map[string]any{"type": "tool", "name": obj.Function.Name}, nil
}

// --- response conversion ---

type anResponse struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Model   string `json:"model"`
	Content []struct {
		Type  string          `json:"type"`
		Text  string          `json:"text"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	} `json:"content"`
	StopReason string `json:"stop_reason"`
	Usage      struct {
		InputTokens              int `json:"input_tokens"`
		OutputTokens             int `json:"output_tokens"`
		CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	} `json:"usage"`
}

type oaCompletion struct {
	ID      string     `json:"id"`
	Object  string     `json:"object"`
	Created int64      `json:"created"`
	Model   string     `json:"model"`
	Choices []oaChoice `json:"choices"`
	Usage   ChatUsage  `json:"usage"`
}

type oaChoice struct {
	Index        int       `json:"index"`
	Message      chatReply `json:"message"`
	FinishReason string    `json:"finish_reason"`
	Logprobs     *struct{} `json:"logprobs"`
}

// AnthropicToChat converts a Messages API response to an OpenAI
// chat.completion. Usage maps as OpenAI counts it: prompt_tokens includes
// cached and cache-written input (Anthropic reports them apart from
// input_tokens), cached_tokens is cache_read_input_tokens.
func AnthropicToChat(body []byte, now time.Time) ([]byte, job.Usage, error) {
	var in anResponse
	if err := json.Unmarshal(body, &in); err != nil || in.Type != "message" {
		return nil, job.Usage{}, errMalformed
	}
	msg := chatReply{Role: "assistant"}
	var text strings.Builder
	for _, b := range in.Content {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "tool_use":
			tc := ChatToolCall{ID: b.ID, Type: "function"}
			tc.Function.Name = b.Name
			tc.Function.Arguments = "{}"
			if len(bytes.TrimSpace(b.Input)) > 0 {
				tc.Function.Arguments = string(b.Input)
			}
			msg.ToolCalls = append(msg.ToolCalls, tc)
		}
	}
	if text.Len() > 0 || len(msg.ToolCalls) == 0 {
		s := text.String()
		msg.Content = &s
	}
	finish := AnthropicFinish(in.StopReason)
	u := in.Usage
	out := oaCompletion{
		ID: in.ID, Object: "chat.completion", Created: now.Unix(), Model: in.Model,
		Choices: []oaChoice{{Index: 0, Message: msg, FinishReason: finish}},
	}
	out.Usage.PromptTokens = u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
	out.Usage.CompletionTokens = u.OutputTokens
	out.Usage.TotalTokens = out.Usage.PromptTokens + out.Usage.CompletionTokens
	out.Usage.PromptTokensDetails.CachedTokens = u.CacheReadInputTokens
	out.Usage.CacheCreationInputTokens, out.Usage.CacheReadInputTokens = u.CacheCreationInputTokens, u.CacheReadInputTokens
	b, err := json.Marshal(out)
	if err != nil {
		return nil, job.Usage{}, err
	}
	return b, job.Usage{
		PromptTokens: out.Usage.PromptTokens, CompletionTokens: out.Usage.CompletionTokens,
		TotalTokens: out.Usage.TotalTokens, CachedTokens: u.CacheReadInputTokens, CacheWriteTokens: u.CacheCreationInputTokens,
	}, nil
}

// AnthropicErrorToOpenAI rewrites {"type":"error","error":{"type","message"}}
// as {"error":{"message","type","param":null,"code":null}}.
func AnthropicErrorToOpenAI(body []byte) ([]byte, bool) {
	var in struct {
		Type  string `json:"type"`
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &in) != nil || in.Type != "error" || in.Error == nil {
		return nil, false
	}
	type oaErr struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	b, err := json.Marshal(struct {
		Error oaErr `json:"error"`
	}{oaErr{Message: in.Error.Message, Type: in.Error.Type}})
	return b, err == nil
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

// AnthropicFinish maps Anthropic's stop_reason to OpenAI's finish_reason.
func AnthropicFinish(stop string) string {
	switch stop {
	case "max_tokens", "model_context_window_exceeded":
		return "length"
	case "tool_use":
		return "tool_calls"
	case "refusal":
		return "content_filter"
	}
	return "stop"
}
