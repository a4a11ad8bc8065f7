package sim

import (
	"encoding/json"
	"math"
	"strings"
)

// Tools and JSON answers. A request that requires a tool call (chat's
// tool_choice "required" or a named function, the Responses API's alike,
// Anthropic's {"type": "any"} or {"type": "tool"}) is answered with one
// call, whatever Config.ToolCalls says: with the named tool, else the
// tools in turn. Its arguments are the smallest JSON value valid for the
// tool's parameters schema (Sample), with the loop counter n added where
// the schema allows it. A chat request with response_format json_schema is
// answered with Sample of its schema as the content, and json_object with
// a JSON object; both finish "stop".

// toolDef is a function tool a request offers.
type toolDef struct {
	name   string
	params json.RawMessage
}

// toolChoice reads a tool_choice of any of the three APIs: none, whether a
// call is required, and the tool named ("": any).
func toolChoice(raw json.RawMessage) (none, required bool, name string) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s == "none", s == "required" || s == "any", ""
	}
	var o struct {
		Type     string `json:"type"`
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &o) != nil {
		return false, false, ""
	}
	name = o.Name
	if name == "" {
		name = o.Function.Name
	}
	switch o.Type {
	case "none":
		return true, false, ""
	case "any":
		return false, true, ""
	case "tool", "function":
		return false, name != "", name
	}
	return false, false, ""
}

// toolArgs are the arguments of the k-th call (1-based) of a tool whose
// parameters schema is params: Sample of it, with "n": k where the schema
// lets an object hold it.
func toolArgs(params json.RawMessage, k int) string {
	var schema map[string]any
	_ = json.Unmarshal(params, &schema)
	v := Sample(schema)
	if obj, ok := v.(map[string]any); ok && counterFits(schema) {
		obj["n"] = k
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// counterFits reports whether an object schema accepts an integer member n.
func counterFits(schema map[string]any) bool {
	props, _ := schema["properties"].(map[string]any)
	if p, ok := props["n"].(map[string]any); ok {
		t, _ := p["type"].(string)
		_, enum := p["enum"]
		return (t == "integer" || t == "number" || t == "") && !enum
	}
	return schema["additionalProperties"] != false
}

// Sample is the smallest JSON value (as encoding/json decodes one) valid
// for a JSON schema: objects with their required properties, the first
// enum or const value, numbers at their minimum, strings of their
// minLength ("x" repeated; "sample" when none), arrays of minItems
// samples of items, false, the first of anyOf/oneOf, and the merge of
// allOf. $ref and patterns are not followed: a schema using them gets {}.
func Sample(schema map[string]any) any { return sample(schema, 0) }

func sample(s map[string]any, depth int) any {
	if depth > 16 || s == nil {
		return map[string]any{}
	}
	if v, ok := s["const"]; ok {
		return v
	}
	if e, ok := s["enum"].([]any); ok && len(e) > 0 {
		return e[0]
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if alts, ok := s[k].([]any); ok && len(alts) > 0 {
			first, _ := alts[0].(map[string]any)
			return sample(first, depth+1)
		}
	}
	if all, ok := s["allOf"].([]any); ok && len(all) > 0 {
		merged := map[string]any{}
		for _, a := range all {
			if m, ok := sample(asSchema(a), depth+1).(map[string]any); ok {
				for k, v := range m {
					merged[k] = v
				}
			}
		}
		return merged
	}
	switch schemaType(s) {
	case "object":
		out := map[string]any{}
		props, _ := s["properties"].(map[string]any)
		req, _ := s["required"].([]any)
		for _, r := range req {
			name, _ := r.(string)
			out[name] = sample(asSchema(props[name]), depth+1)
		}
		return out
	case "array":
		n, _ := s["minItems"].(float64)
		out := make([]any, 0, int(n))
		for range int(min(n, 64)) {
			out = append(out, sample(asSchema(s["items"]), depth+1))
		}
		return out
	case "string":
		if n, ok := s["minLength"].(float64); ok && n > 0 {
			return strings.Repeat("x", int(min(n, 1024)))
		}
		return "sample"
	case "integer", "number":
		return number(s)
	case "boolean":
		return false
	case "null":
		return nil
	}
	return map[string]any{}
}

func asSchema(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// schemaType is s's type: the first non-null of a list, "object" when s
// names properties but no type.
func schemaType(s map[string]any) string {
	switch t := s["type"].(type) {
	case string:
		return t
	case []any:
		for _, x := range t {
			if name, _ := x.(string); name != "" && name != "null" {
				return name
			}
		}
		return "null"
	}
	if _, ok := s["properties"]; ok {
		return "object"
	}
	return ""
}

// number is the least number s allows: its minimum (past an exclusive
// one), else 0 capped by its maximum.
func number(s map[string]any) float64 {
	v := 0.0
	if m, ok := s["minimum"].(float64); ok {
		v = m
	}
	if m, ok := s["exclusiveMinimum"].(float64); ok {
		v = m + 1
		if schemaType(s) == "number" {
			v = m + 0.5
		}
	}
	if m, ok := s["maximum"].(float64); ok && v > m {
		v = m
	}
	if schemaType(s) == "integer" {
		v = math.Ceil(v)
	}
	return v
}

// jsonAnswer is the content a chat request's response_format asks for
// (nil: none).
func jsonAnswer(body []byte) *string {
	var b struct {
		ResponseFormat *struct {
			Type       string `json:"type"`
			JSONSchema struct {
				Schema map[string]any `json:"schema"`
			} `json:"json_schema"`
		} `json:"response_format"`
	}
	if json.Unmarshal(body, &b) != nil || b.ResponseFormat == nil {
		return nil
	}
	var v any
	switch b.ResponseFormat.Type {
	case "json_schema":
		v = Sample(b.ResponseFormat.JSONSchema.Schema)
	case "json_object":
		v = map[string]any{"answer": "sample"}
	default:
		return nil
	}
	out, _ := json.Marshal(v)
	s := string(out)
	return &s
}
