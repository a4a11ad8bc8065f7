package wire

// chatReply is a chat.completion's assistant message: what AnthropicToChat
// writes and what FromChat and ChatToMessage read.
type chatReply struct {
	Role      string         `json:"role"`
	Content   *string        `json:"content"`
	Refusal   *string        `json:"refusal"`
	ToolCalls []ChatToolCall `json:"tool_calls,omitempty"`
}
