package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/wire"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
)

// shapeBody applies the model's body-field policy to a chat request and
// writes the output bound its reservation assumed into a body that names
// none: a body sent without one lets the provider pick the length (often
// its maximum), past what the tenant's and the model's token budgets
// charged. Embeddings have no output to bound.
func shapeBody(j *task.Task, p *config.Provider, m *config.Model, defMax int) error {
	if j.Endpoint == job.EndpointEmbeddings {
		return nil
	}
	var fields map[string]json.RawMessage
	if j.Endpoint != job.EndpointResponses { // whose request wire.ParseRequest checked
		var err error
		if fields, err = wire.CheckChat(j.Request, func(name string) bool { return slices.Contains(m.AllowFields, name) }); err != nil {
			return err
		}
	} else if err := json.Unmarshal(j.Request, &fields); err != nil {
		return &job.ValidationError{Code: job.CodeInvalidRequest, Field: "request", Message: "must be a JSON object"}
	}
	if err := deniedField(fields, m); err != nil {
		return err
	}
	// OpenAI's reasoning models refuse max_tokens.
	reasoning := p.Kind != "anthropic" && reasoningModel(m.Name)
	if reasoning && set(fields["max_tokens"]) && !set(fields["max_completion_tokens"]) {
		// The bound the caller set, under the name the model takes.
		fields["max_completion_tokens"] = fields["max_tokens"]
		delete(fields, "max_tokens")
		return encodeBody(j, fields)
	}
	if defMax <= 0 || set(fields["max_tokens"]) || set(fields["max_completion_tokens"]) {
		return nil
	}
	key := "max_tokens"
	if reasoning {
		key = "max_completion_tokens"
	}
	if _, null := fields["max_tokens"]; !null && len(fields) > 0 {
		if _, null = fields["max_completion_tokens"]; !null {
			// The common case: append the field, leaving the rest of the
			// body as the caller wrote it.
			body := bytes.TrimRight(j.Request, " \t\r\n")
			out := make([]byte, 0, len(body)+32)
			out = append(out, body[:len(body)-1]...)
			out = append(out, `,"`+key+`":`+strconv.Itoa(defMax)+`}`...)
			j.Request = out
			return nil
		}
	}
	// A field given as null: rewrite the object without it.
	delete(fields, "max_tokens")
	delete(fields, "max_completion_tokens")
	fields[key] = json.RawMessage(strconv.Itoa(defMax))
	return encodeBody(j, fields)
}

// deniedField refuses the first field (by name) of a body that the
// model's policy denies (config.Model.FieldDenied). A retention field
// asking nothing kept (store: false, null) passes.
func deniedField(fields map[string]json.RawMessage, m *config.Model) error {
	names := slices.Sorted(maps.Keys(fields))
	for _, name := range names {
		if !m.FieldDenied(name) {
			continue
		}
		why := "it changes what the call costs in ways Sluice's budgets do not count"
		if slices.Contains(config.RetainedFields, name) && !slices.Contains(m.DenyFields, name) {
			if v := string(bytes.TrimSpace(fields[name])); v == "null" || (name == "store" && v == "false") {
				continue
			}
			why = "the provider would keep the completion in the operator's account, which every tenant shares"
		}
		return &job.ValidationError{Code: job.CodeInvalidRequest, Field: "request." + clip.String(name, 64),
			Message: fmt.Sprintf("is not allowed for model %q: %s (the operator can let it through with the model's allow_fields)", m.Name, why)}
	}
	return nil
}

// encodeBody writes fields as the job's request.
func encodeBody(j *task.Task, fields map[string]json.RawMessage) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(fields); err != nil {
		return &job.ValidationError{Code: job.CodeInvalidRequest, Field: "request", Message: "cannot be re-encoded"}
	}
	j.Request = bytes.TrimRight(buf.Bytes(), "\n")
	return nil
}

// set reports whether a JSON value is present and not null.
func set(v json.RawMessage) bool { return len(v) > 0 && string(bytes.TrimSpace(v)) != "null" }

// reasoningModel reports an OpenAI reasoning model by its name, which takes
// max_completion_tokens only.
func reasoningModel(name string) bool {
	for _, p := range []string{"o1", "o3", "o4", "gpt-5"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
