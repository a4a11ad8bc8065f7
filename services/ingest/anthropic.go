package ingest

import (
	"fmt"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/pkg/job"
)

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
