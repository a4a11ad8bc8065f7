package config

import (
	"slices"
)

// DefaultDeniedFields are request body fields that change what a call costs
// in ways Sluice's budgets do not count (a faster, dearer tier; audio output;
// paid web searches; predicted outputs, whose rejected tokens are billed).
// A job naming one is refused unless the model's allow_fields lets it
// through.
var DefaultDeniedFields = []string{"service_tier", "modalities", "audio", "web_search_options", "prediction"}

// RetainedFields are chat body fields that have the provider keep the
// completion in the operator's account (OpenAI's stored completions:
// store, and the metadata it is filed under), where every tenant of that
// account's key could see it. A job setting one (store: false and null
// ask nothing kept) is refused unless the model's allow_fields lets it
// through.
var RetainedFields = []string{"store", "metadata"}

// FieldDenied reports whether a top-level request body field is refused for
// this model: it is in deny_fields, or in DefaultDeniedFields or
// RetainedFields and not in allow_fields.
func (m Model) FieldDenied(name string) bool {
	if slices.Contains(m.DenyFields, name) {
		return true
	}
	return (slices.Contains(DefaultDeniedFields, name) || slices.Contains(RetainedFields, name)) && !slices.Contains(m.AllowFields, name)
}

// TenantBytes is one tenant's byte bound in the stream: max_bytes_per_tenant,
// or else an equal share of max_bytes among tenants (at least one message of
// the largest size), so no tenant can fill the stream for the others.
func (b StreamBounds) TenantBytes(tenants int) int64 {
	if b.MaxBytesPerTenant > 0 {
		return b.MaxBytesPerTenant
	}
	return max(b.MaxBytes/int64(max(tenants, 1)), MinStreamBytes)
}

// OtherTask is the metric label of a task no route names: caller-chosen
// names must not grow the label set without bound.
const OtherTask = "other"

// TaskLabel is a job's task as a metric label: "default" for none, the name
// of a task a route serves, OtherTask for any other.
func (c *Config) TaskLabel(task string) string {
	if task == "" {
		return "default"
	}
	for _, r := range c.Routes {
		if r.Task == task {
			return task
		}
	}
	return OtherTask
}
