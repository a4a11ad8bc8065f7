package sim_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestSample: the smallest value valid for each kind of schema.
func TestSample(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ schema, want string }{
		{`{"type":"object"}`, `{}`},
		{`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},"required":["a"]}`, `{"a":"sample"}`},
		{`{"properties":{"u":{"enum":["c","f"]},"ok":{"type":"boolean"}},"required":["u","ok"]}`, `{"ok":false,"u":"c"}`},
		{`{"type":"array","items":{"type":"number","minimum":2.5},"minItems":2}`, `[2.5,2.5]`},
		{`{"type":"integer","exclusiveMinimum":3,"maximum":10}`, `4`},
		{`{"type":["null","string"],"minLength":3}`, `"xxx"`},
		{`{"anyOf":[{"type":"boolean"},{"type":"string"}]}`, `false`},
		{`{"allOf":[{"type":"object","properties":{"a":{"const":1}},"required":["a"]},{"type":"object","properties":{"b":{"type":"null"}},"required":["b"]}]}`, `{"a":1,"b":null}`},
		{`{"type":"object","properties":{"in":{"type":"object","properties":{"x":{"type":"array"}},"required":["x"]}},"required":["in"]}`, `{"in":{"x":[]}}`},
	} {
		var s map[string]any
		if err := json.Unmarshal([]byte(tc.schema), &s); err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(sim.Sample(s))
		if string(got) != tc.want {
			t.Errorf("Sample(%s) = %s, want %s", tc.schema, got, tc.want)
		}
	}
}

// weather is a tool's parameters, as a struct and as its schema.
type weather struct {
	City  string `json:"city"`
	Unit  string `json:"unit"`
	Days  int    `json:"days"`
	Hours []int  `json:"hours"`
}

var weatherSchema = map[string]any{"type": "object", "additionalProperties": false, "required": []any{"city", "unit", "days", "hours"},
	"properties": map[string]any{"city": map[string]any{"type": "string"}, "unit": map[string]any{"type": "string", "enum": []any{"celsius", "fahrenheit"}},
		"days": map[string]any{"type": "integer", "minimum": 1}, "hours": map[string]any{"type": "array", "items": map[string]any{"type": "integer"}, "minItems": 1}}}

// TestToolCallsAndJSONThroughSDK: with no tool-call option set, a request
// that requires a tool (tool_choice "required", or a named function) is
// answered with a call whose arguments the official SDK's caller
// unmarshals into the schema's struct, streamed or not; "auto" gets text;
// response_format json_schema gets content valid for the schema, and
// json_object a JSON object.
func TestToolCallsAndJSONThroughSDK(t *testing.T) {
	t.Parallel()
	_, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 600, TPM: 1_000_000}}, TTFT: time.Millisecond})
	c := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tools := []openai.ChatCompletionToolUnionParam{
		openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "lookup", Parameters: shared.FunctionParameters{"type": "object"}}),
		openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather", Parameters: weatherSchema}),
	}
	params := func(choice openai.ChatCompletionToolChoiceOptionUnionParam) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(32), Tools: tools, ToolChoice: choice,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Paris?")}}
	}
	named := openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"})
	required := openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}
	check := func(what string, finish string, calls []openai.ChatCompletionMessageToolCallUnion) {
		t.Helper()
		if finish != "tool_calls" || len(calls) != 1 {
			t.Fatalf("%s: finish %q, %d tool calls; want tool_calls and one", what, finish, len(calls))
		}
		fn := calls[0].Function
		if !strings.HasPrefix(what, "required") && fn.Name != "get_weather" {
			t.Fatalf("%s: called %q, want get_weather", what, fn.Name)
		}
		if fn.Name == "get_weather" {
			var w weather
			if err := json.Unmarshal([]byte(fn.Arguments), &w); err != nil || w.Unit != "celsius" || w.Days < 1 || len(w.Hours) != 1 || w.City == "" {
				t.Fatalf("%s: arguments %s (%v), want the schema's struct with every required field valid", what, fn.Arguments, err)
			}
		}
	}
	for what, choice := range map[string]openai.ChatCompletionToolChoiceOptionUnionParam{"required": required, "named": named} {
		r, err := c.Chat.Completions.New(ctx, params(choice))
		if err != nil {
			t.Fatal(err)
		}
		check(what, r.Choices[0].FinishReason, r.Choices[0].Message.ToolCalls)
		st := c.Chat.Completions.NewStreaming(ctx, params(choice))
		var acc openai.ChatCompletionAccumulator
		for st.Next() {
			acc.AddChunk(st.Current())
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		check(what+" streamed", acc.Choices[0].FinishReason, acc.Choices[0].Message.ToolCalls)
	}
	r, err := c.Chat.Completions.New(ctx, params(openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")}))
	if err != nil || r.Choices[0].FinishReason == "tool_calls" || len(r.Choices[0].Message.ToolCalls) != 0 {
		t.Fatalf("tool_choice auto without the tool-call option: %+v (%v), want text", r, err)
	}

	format := openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
		JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "weather", Schema: weatherSchema, Strict: openai.Bool(true)}}}
	p := openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(2), ResponseFormat: format,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Paris?")}}
	r, err = c.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	var w weather
	if err := json.Unmarshal([]byte(r.Choices[0].Message.Content), &w); err != nil || w.Unit != "celsius" || r.Choices[0].FinishReason != "stop" {
		t.Fatalf("json_schema answer %q finish %q (%v), want the schema's JSON, stop", r.Choices[0].Message.Content, r.Choices[0].FinishReason, err)
	}
	st := c.Chat.Completions.NewStreaming(ctx, p)
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	var streamed weather
	if err := st.Err(); err != nil || json.Unmarshal([]byte(acc.Choices[0].Message.Content), &streamed) != nil || !reflect.DeepEqual(streamed, w) {
		t.Fatalf("streamed json_schema answer %q (%v), want %+v", acc.Choices[0].Message.Content, err, w)
	}
	p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}
	r, err = c.Chat.Completions.New(ctx, p)
	var obj map[string]any
	if err != nil || json.Unmarshal([]byte(r.Choices[0].Message.Content), &obj) != nil {
		t.Fatalf("json_object answer %+v (%v), want a JSON object", r, err)
	}
}

// TestMessagesToolUse: Anthropic's tool_choice any (or a named tool) is
// answered with a tool_use block whose input is valid for input_schema.
func TestMessagesToolUse(t *testing.T) {
	t.Parallel()
	_, url := start(t, sim.Config{Profile: sim.ProfileAnthropic, Models: []sim.ModelLimits{{Name: claude, RPM: 50, ITPM: 50_000, OTPM: 10_000}}})
	schema, _ := json.Marshal(weatherSchema)
	for _, choice := range []string{`{"type":"any"}`, `{"type":"tool","name":"get_weather"}`} {
		status, _, out := messages(t, url, `{"model":"`+claude+`","max_tokens":64,"tool_choice":`+choice+`,
			"tools":[{"name":"get_weather","input_schema":`+string(schema)+`}],"messages":[{"role":"user","content":"Weather?"}]}`)
		content, _ := out["content"].([]any)
		if status != 200 || out["stop_reason"] != "tool_use" || len(content) != 1 {
			t.Fatalf("%s: %d %v, want one tool_use block", choice, status, out)
		}
		block, _ := content[0].(map[string]any)
		raw, _ := json.Marshal(block["input"])
		var w weather
		if block["type"] != "tool_use" || block["name"] != "get_weather" || json.Unmarshal(raw, &w) != nil || w.Unit != "celsius" {
			t.Errorf("%s: block %v, want get_weather with input of the schema", choice, block)
		}
	}
}
