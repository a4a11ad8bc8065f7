package job

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/sluice-dev/sluice/pkg/clip"
)

// CodeIdempotencyMismatch refuses an idempotency key used before with a
// different request: the key names one operation, and the answer to the
// first request would not answer this one.
const CodeIdempotencyMismatch = "idempotency_key_reused"

// DecodeError turns a JSON decoding error of a body into a validation
// error that names the field at fault and the JSON type it must be, the
// way OpenAI's API words it, instead of Go's own message (which names Go
// types: "Go struct field ChatRequest.max_tokens of type int"). prefix is
// the field the body sits under ("request", or "" for an envelope); what
// names the body for a syntax error.
func DecodeError(prefix, what string, err error) *ValidationError {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return invalid(prefix, "malformed %s: expected %s, but got %s", what, jsonKind(te.Type), jsonValue(te.Value))
		}
		return invalid(joinField(prefix, te.Field), "invalid type: expected %s, but got %s", jsonKind(te.Type), jsonValue(te.Value))
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return invalid(prefix, "malformed %s: %s (at byte %d)", what, se.Error(), se.Offset)
	}
	msg := err.Error()
	if strings.Contains(msg, "Go ") || strings.Contains(msg, "unmarshal") {
		msg = "not the expected JSON"
	}
	return invalid(prefix, "malformed %s: %s", what, strings.TrimPrefix(msg, "json: "))
}

func joinField(prefix, f string) string {
	if prefix == "" {
		return f
	}
	return prefix + "." + f
}

// jsonKind names the JSON type a Go type decodes from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "another type"
}

// jsonValue names the JSON value the decoder found (UnmarshalTypeError's
// Value: "string", "number", "number 1.5", "bool", "array", "object").
func jsonValue(v string) string {
	switch {
	case v == "string":
		return "a string"
	case v == "bool":
		return "a boolean"
	case v == "array":
		return "an array"
	case v == "object":
		return "an object"
	case v == "number":
		return "a number"
	case strings.HasPrefix(v, "number "):
		n := strings.TrimPrefix(v, "number ")
		if len(n) > 24 {
			n = n[:24] + "…"
		}
		return fmt.Sprintf("the number %s", n)
	}
	return "a " + clip.String(v, 64)
}
