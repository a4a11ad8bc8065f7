package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Prompt caching and extended thinking on /v1/messages: a breakpoint
// (cache_control) on a system block, a content block or a tool is carried
// in the chat body on the part, tool or message it marks, and thinking as
// a top-level member, so an Anthropic provider receives them as sent (and
// admission reserves a warm prefix net of the cache read).

// present returns raw, or nil when it is absent or JSON null.
func present(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

// systemMessage reads system (a string or an array of text blocks) as a
// chat system message: a string, or text parts when a block carries a
// breakpoint; nil when there is none.
func systemMessage(raw json.RawMessage) (*oaOutMsg, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var blocks []anInBlock
	if json.Unmarshal(raw, &blocks) != nil {
		text, err := systemText(raw)
		if err != nil || text == "" {
			return nil, err
		}
		return &oaOutMsg{Role: "system", Content: text}, nil
	}
	marked := false
	for _, b := range blocks {
		marked = marked || present(b.CacheControl) != nil
	}
	if !marked {
		text, err := systemText(raw)
		if err != nil || text == "" {
			return nil, err
		}
		return &oaOutMsg{Role: "system", Content: text}, nil
	}
	parts := make([]oaPart, 0, len(blocks))
	for i, b := range blocks {
		if b.Type != "text" {
			return nil, fmt.Errorf("system[%d].type: must be text", i)
		}
		parts = append(parts, oaPart{Type: "text", Text: b.Text, CacheControl: present(b.CacheControl)})
	}
	return &oaOutMsg{Role: "system", Content: parts}, nil
}

// withThinking carries Anthropic's thinking object into the chat body.
// Its budget is output: the Messages API requires it below max_tokens,
// so the max_tokens reserved covers it.
func withThinking(out map[string]any, raw json.RawMessage, maxTokens int) error {
	raw = present(raw)
	if raw == nil {
		return nil
	}
	var th struct {
		Type         string `json:"type"`
		BudgetTokens *int   `json:"budget_tokens"`
	}
	if json.Unmarshal(raw, &th) != nil {
		return errors.New("thinking: must be an object")
	}
	switch th.Type {
	case "disabled":
	case "enabled":
		if th.BudgetTokens == nil {
			return errors.New("thinking.budget_tokens: Field required")
		}
		if *th.BudgetTokens < 1 || *th.BudgetTokens >= maxTokens {
			return fmt.Errorf("thinking.budget_tokens: must be at least 1 and less than max_tokens (%d), got %d", maxTokens, *th.BudgetTokens)
		}
	default:
		return fmt.Errorf("thinking.type: must be enabled or disabled, got %q", clip(th.Type))
	}
	out["thinking"] = raw
	return nil
}

// splitTooLarge refuses a job no minute of a model limited on input and
// output tokens apart can hold: a prompt above its itpm, or an output
// limit above its otpm.
func splitTooLarge(est job.Estimate, model *config.Model) error {
	if model.ITPM > 0 && est.PromptTokens > model.ITPM {
		return &job.ValidationError{Code: job.CodeTooLarge, Field: "request",
			Message: fmt.Sprintf("needs %d input tokens, above the model's limit of %d input tokens per minute", est.PromptTokens, model.ITPM)}
	}
	if model.OTPM > 0 && est.MaxTokens > model.OTPM {
		return &job.ValidationError{Code: job.CodeTooLarge, Field: "request",
			Message: fmt.Sprintf("asks for up to %d output tokens, above the model's limit of %d output tokens per minute", est.MaxTokens, model.OTPM)}
	}
	return nil
}
