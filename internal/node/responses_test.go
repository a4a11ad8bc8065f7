package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/node"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// A Responses backend: how the simulator and the provider are set up, and
// where a call shows at the simulator.
type respBackend struct {
	name     string
	provider string // the provider's YAML (%s: the simulator's URL)
	sim      sim.Config
	// received returns the bodies the provider got for the API it was
	// called on.
	received func(s *sim.Server) [][]byte
}

const respModel = "resp-model"

func simRequests(path string) func(s *sim.Server) [][]byte {
	return func(s *sim.Server) [][]byte {
		var out [][]byte
		for _, r := range s.Requests() {
			if r.Path == path {
				out = append(out, r.Body)
			}
		}
		return out
	}
}

var respBackends = []respBackend{
	{name: "native", provider: `
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    responses: native
    models:
      - {name: resp-model, rpm: 100000, tpm: 10000000}`,
		sim: sim.Config{ToolCalls: 2}, received: simRequests("/v1/responses")},
	{name: "chat", provider: `
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: resp-model, rpm: 100000, tpm: 10000000}`,
		sim: sim.Config{ToolCalls: 2, NoResponses: true}, received: simRequests("/v1/chat/completions")},
	{name: "anthropic", provider: `
  - name: claude
    kind: anthropic
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: resp-model, rpm: 100000, itpm: 1000000, otpm: 1000000}`,
		sim: sim.Config{ToolCalls: 2}, received: (*sim.Server).Received},
}

type respNode struct {
	sim  *sim.Server
	info node.Info
	sdk  openai.Client
	base string
}

// startResponses runs a node with HTTP in front of the backend's
// simulator.
func startResponses(t *testing.T, b respBackend) respNode {
	t.Helper()
	sc := b.sim
	if sc.Models == nil {
		sc.Models = []sim.ModelLimits{{Name: respModel, RPM: 100000, TPM: 10000000, ITPM: 1000000, OTPM: 1000000}}
	}
	sc.APIKeys = []string{"sim-secret"}
	s, url := systest.StartSim(t, sc)
	cfg, err := config.Parse([]byte(fmt.Sprintf("providers:"+b.provider+`
tenants:
  - {name: acme, api_key_env: ACME_KEY}
  - {name: globex, api_key_env: GLOBEX_KEY}
`, url)))
	if err != nil {
		t.Fatal(err)
	}
	info, _ := startNode(t, cfg, t.TempDir())
	base := "http://" + info.HTTPAddr
	return respNode{sim: s, info: info, base: base,
		sdk: openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("acme-key"), option.WithMaxRetries(0))}
}

func usageOf(r *responses.Response) int64 { return r.Usage.TotalTokens }

var weather = responses.ToolParamOfFunction("get_weather", map[string]any{"type": "object", "properties": map[string]any{"n": map[string]any{"type": "integer"}}}, false)

// TestResponsesSDK drives POST /v1/responses with the official OpenAI Go
// SDK against each backend: a simulator serving the Responses API
// natively, a chat-only simulator, and an Anthropic-kind one.
func TestResponsesSDK(t *testing.T) {
	t.Parallel()
	for _, b := range respBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			n := startResponses(t, b)
			ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
			defer cancel()
			var total int64

			// A string input.
			r1, err := n.sdk.Responses.New(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32),
				Instructions: openai.String("Be brief."), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hello.")}})
			if err != nil {
				t.Fatalf("Responses.New: %v", err)
			}
			if r1.Status != responses.ResponseStatusCompleted && r1.Status != responses.ResponseStatusIncomplete || r1.OutputText() == "" {
				t.Fatalf("status %q text %q, want completed with text", r1.Status, r1.OutputText())
			}
			if !strings.HasPrefix(r1.ID, "resp_") || r1.Usage.InputTokens <= 0 || r1.Usage.OutputTokens <= 0 {
				t.Fatalf("id %q usage %+v, want resp_... and input and output tokens", r1.ID, r1.Usage)
			}
			total += usageOf(r1)
			if got := b.received(n.sim); len(got) != 1 {
				t.Fatalf("the provider got %d calls on its %s API, want 1", len(got), b.name)
			}

			// Items with a function tool, then the function_call_output turn.
			items := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("What is the weather?", responses.EasyInputMessageRoleUser)}
			r2, err := n.sdk.Responses.New(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32),
				Input: responses.ResponseNewParamsInputUnion{OfInputItemList: items}, Tools: []responses.ToolUnionParam{weather}, Store: openai.Bool(false)})
			if err != nil {
				t.Fatalf("Responses.New with a tool: %v", err)
			}
			if len(r2.Output) != 1 || r2.Output[0].Type != "function_call" {
				t.Fatalf("output %+v, want one function_call", r2.Output)
			}
			fc := r2.Output[0].AsFunctionCall()
			if fc.Name != "get_weather" || fc.CallID == "" || !json.Valid([]byte(fc.Arguments)) {
				t.Fatalf("function call %+v, want get_weather with a call id and JSON arguments", fc)
			}
			total += usageOf(r2)
			items = append(items, responses.ResponseInputItemParamOfFunctionCall(fc.Arguments, fc.CallID, fc.Name),
				responses.ResponseInputItemParamOfFunctionCallOutput("sunny"))
			items[len(items)-1].OfFunctionCallOutput.CallID = openai.String(fc.CallID)
			r3, err := n.sdk.Responses.New(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32),
				Input: responses.ResponseNewParamsInputUnion{OfInputItemList: items}, Tools: []responses.ToolUnionParam{weather}})
			if err != nil {
				t.Fatalf("Responses.New with the function output: %v", err)
			}
			// ToolCalls: 2, so the simulator calls once more, then answers.
			if len(r3.Output) != 1 || r3.Output[0].Type != "function_call" {
				t.Fatalf("after one result: output %+v, want a second function_call", r3.Output)
			}
			total += usageOf(r3)
			got := b.received(n.sim)
			last := string(got[len(got)-1])
			if !strings.Contains(last, fc.CallID) || !strings.Contains(last, "sunny") {
				t.Errorf("the provider's last call does not carry the call id and its output: %s", last)
			}
			// A stored response is there to get; one with store: false is not.
			if _, err := n.sdk.Responses.Get(ctx, r2.ID, responses.ResponseGetParams{}); !isStatus(err, http.StatusNotFound) {
				t.Errorf("Get of a response with store: false: %v, want 404", err)
			}

			// A stream consumed to response.completed.
			st := n.sdk.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32),
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Stream, please.")}})
			var types []string
			var text strings.Builder
			var done responses.Response
			seq := int64(-1)
			for st.Next() {
				ev := st.Current()
				if ev.SequenceNumber != seq+1 {
					t.Errorf("event %s: sequence_number %d after %d", ev.Type, ev.SequenceNumber, seq)
				}
				seq = ev.SequenceNumber
				types = append(types, ev.Type)
				switch ev.Type {
				case "response.output_text.delta":
					text.WriteString(ev.Delta)
				case "response.completed", "response.incomplete":
					done = ev.Response
				case "response.failed":
					t.Errorf("response.failed: %s", ev.RawJSON())
				}
			}
			if err := st.Err(); err != nil {
				t.Fatalf("stream: %v (events %v)", err, types)
			}
			if len(types) < 6 || types[0] != "response.created" || types[1] != "response.in_progress" || types[2] != "response.output_item.added" ||
				types[3] != "response.content_part.added" {
				t.Fatalf("events %v, want created, in_progress, output_item.added, content_part.added, deltas …", types)
			}
			if done.ID == "" || done.OutputText() != text.String() || text.Len() == 0 || done.Usage.OutputTokens <= 0 {
				t.Fatalf("final response %q (usage %+v), deltas %q: want the deltas' text with usage", done.OutputText(), done.Usage, text.String())
			}
			total += usageOf(&done)

			// A streamed tool call: its arguments as deltas, the item whole at the end.
			st = n.sdk.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32),
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Weather?")}, Tools: []responses.ToolUnionParam{weather}, Store: openai.Bool(false)})
			var args strings.Builder
			done = responses.Response{}
			for st.Next() {
				switch ev := st.Current(); ev.Type {
				case "response.function_call_arguments.delta":
					args.WriteString(ev.Delta)
				case "response.completed":
					done = ev.Response
				}
			}
			if err := st.Err(); err != nil {
				t.Fatalf("streamed tool call: %v", err)
			}
			if len(done.Output) != 1 || done.Output[0].Type != "function_call" || args.String() != `{"n":1}` ||
				done.Output[0].AsFunctionCall().Arguments != args.String() || done.Output[0].AsFunctionCall().Name != "get_weather" {
				t.Fatalf("streamed tool call: output %+v, argument deltas %q; want get_weather with {\"n\":1}", done.Output, args.String())
			}
			total += usageOf(&done)

			// previous_response_id over three turns.
			prev := ""
			var turns []*responses.Response
			for i, say := range []string{"My name is Ada.", "I live in Paris.", "Where do I live?"} {
				p := responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(say)}}
				if prev != "" {
					p.PreviousResponseID = openai.String(prev)
				}
				r, err := n.sdk.Responses.New(ctx, p)
				if err != nil {
					t.Fatalf("turn %d: %v", i+1, err)
				}
				if r.PreviousResponseID != prev {
					t.Errorf("turn %d: previous_response_id %q, want %q", i+1, r.PreviousResponseID, prev)
				}
				total += usageOf(r)
				turns = append(turns, r)
				prev = r.ID
			}
			got = b.received(n.sim)
			last = string(got[len(got)-1])
			for _, want := range []string{"My name is Ada.", "I live in Paris.", "Where do I live?", turns[0].OutputText()[:10], turns[1].OutputText()[:10]} {
				if !strings.Contains(last, want) {
					t.Errorf("the third turn's call does not carry %q: %s", want, last)
				}
			}

			// Get returns the stored response; another tenant's key does not.
			g, err := n.sdk.Responses.Get(ctx, turns[1].ID, responses.ResponseGetParams{})
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if g.ID != turns[1].ID || g.OutputText() != turns[1].OutputText() || g.Usage.TotalTokens != turns[1].Usage.TotalTokens {
				t.Errorf("Get: %q %q, want %q %q", g.ID, g.OutputText(), turns[1].ID, turns[1].OutputText())
			}
			globex := openai.NewClient(option.WithBaseURL(n.base+"/v1"), option.WithAPIKey("globex-key"), option.WithMaxRetries(0))
			if _, err := globex.Responses.Get(ctx, turns[1].ID, responses.ResponseGetParams{}); !isStatus(err, http.StatusNotFound) {
				t.Errorf("Get by another tenant: %v, want 404", err)
			}
			_, err = globex.Responses.New(ctx, responses.ResponseNewParams{Model: respModel, PreviousResponseID: openai.String(turns[1].ID),
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
			if !isStatus(err, http.StatusNotFound) {
				t.Errorf("previous_response_id of another tenant: %v, want 404", err)
			}
			if err := n.sdk.Responses.Delete(ctx, turns[1].ID); err != nil {
				t.Fatalf("Delete: %v", err)
			}
			if _, err := n.sdk.Responses.Get(ctx, turns[1].ID, responses.ResponseGetParams{}); !isStatus(err, http.StatusNotFound) {
				t.Errorf("Get after Delete: %v, want 404", err)
			}

			// The executor counted every reported token (the usage it settles
			// reservations with).
			natstest.Eventually(t, 10*time.Second, func() error {
				if got := counter(t, n.info.Registry, "llm_tokens_used_total", nil); got != float64(total) {
					return fmt.Errorf("tokens used %v, want %d", got, total)
				}
				return nil
			})
		})
	}
}

func isStatus(err error, status int) bool {
	var apiErr *openai.Error
	return errors.As(err, &apiErr) && apiErr.StatusCode == status
}

// TestResponsesAgentLoop runs an agent loop as the OpenAI Agents SDK
// drives one: the model calls a tool, gets its output, calls another,
// gets that output and answers, and the user says thanks; four turns
// chained by previous_response_id, each sending only the new items.
func TestResponsesAgentLoop(t *testing.T) {
	t.Parallel()
	for _, b := range respBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			n := startResponses(t, b)
			ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
			defer cancel()
			lookup := responses.ToolParamOfFunction("lookup", map[string]any{"type": "object"}, false)
			tools := []responses.ToolUnionParam{weather, lookup}
			turn := func(prev string, input responses.ResponseInputParam) *responses.Response {
				t.Helper()
				p := responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32), Tools: tools,
					Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}}
				if prev != "" {
					p.PreviousResponseID = openai.String(prev)
				}
				r, err := n.sdk.Responses.New(ctx, p)
				if err != nil {
					t.Fatalf("turn after %q: %v", prev, err)
				}
				return r
			}
			output := func(r *responses.Response, result string) responses.ResponseInputParam {
				t.Helper()
				if len(r.Output) != 1 || r.Output[0].Type != "function_call" {
					t.Fatalf("output %+v, want one function_call", r.Output)
				}
				item := responses.ResponseInputItemParamOfFunctionCallOutput(result)
				item.OfFunctionCallOutput.CallID = openai.String(r.Output[0].AsFunctionCall().CallID)
				return responses.ResponseInputParam{item}
			}
			r1 := turn("", responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("Weather in Paris, and the news?", responses.EasyInputMessageRoleUser)})
			if name := r1.Output[0].AsFunctionCall().Name; name != "get_weather" {
				t.Fatalf("first call %q, want get_weather", name)
			}
			r2 := turn(r1.ID, output(r1, "sunny, 21C"))
			if name := r2.Output[0].AsFunctionCall().Name; name != "lookup" {
				t.Fatalf("second call %q, want lookup", name)
			}
			r3 := turn(r2.ID, output(r2, "no news today"))
			if r3.OutputText() == "" || r3.Output[0].Type != "message" {
				t.Fatalf("third turn: output %+v, want the answer", r3.Output)
			}
			r4 := turn(r3.ID, responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("Thanks!", responses.EasyInputMessageRoleUser)})
			if r4.OutputText() == "" || r4.PreviousResponseID != r3.ID {
				t.Fatalf("fourth turn: output %+v previous %q, want an answer after %s", r4.Output, r4.PreviousResponseID, r3.ID)
			}
			got := b.received(n.sim)
			if len(got) != 4 {
				t.Fatalf("the provider got %d calls, want 4", len(got))
			}
			last := string(got[3])
			for _, want := range []string{r1.Output[0].AsFunctionCall().CallID, r2.Output[0].AsFunctionCall().CallID, "sunny, 21C", "no news today",
				"Weather in Paris, and the news?", "Thanks!", r3.OutputText()[:10]} {
				if !strings.Contains(last, want) {
					t.Errorf("the fourth call does not carry %q: %s", want, last)
				}
			}
		})
	}
}

// TestResponsesStreamBoundary: a stream the provider cuts before its
// first token is retried unseen (the caller reads one whole answer); cut
// after it, the provider is called exactly once and the response ends
// incomplete with what was sent.
func TestResponsesStreamBoundary(t *testing.T) {
	t.Parallel()
	for _, b := range respBackends[:2] { // the simulator's Messages stream has no faults
		for _, after := range []int{0, 3} {
			t.Run(fmt.Sprintf("%s/cut_after_%d", b.name, after), func(t *testing.T) {
				t.Parallel()
				b := b
				b.sim.Faults = sim.Faults{RateStreamCut: 1, MaxFaults: 1, StreamCutAfter: after}
				n := startResponses(t, b)
				ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
				defer cancel()
				st := n.sdk.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32),
					Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Tell me a story.")}})
				var text strings.Builder
				var end responses.ResponseStreamEventUnion
				created := 0
				for st.Next() {
					ev := st.Current()
					switch ev.Type {
					case "response.created":
						created++
					case "response.output_text.delta":
						text.WriteString(ev.Delta)
					case "response.completed", "response.incomplete", "response.failed":
						end = ev
					}
				}
				if err := st.Err(); err != nil {
					t.Fatalf("stream: %v", err)
				}
				calls := len(b.received(n.sim))
				if after == 0 {
					if end.Type != "response.completed" || created != 1 || end.Response.OutputText() != text.String() {
						t.Fatalf("ended %q after %d response.created, text %q vs %q: want one whole answer", end.Type, created, end.Response.OutputText(), text.String())
					}
					if calls != 2 {
						t.Errorf("the provider got %d calls, want 2 (the cut one, retried)", calls)
					}
					return
				}
				if end.Type != "response.incomplete" || end.Response.IncompleteDetails.Reason != "interrupted" {
					t.Fatalf("ended %q (%s), want response.incomplete, reason interrupted", end.Type, end.RawJSON())
				}
				if words := strings.Fields(text.String()); len(words) != after || end.Response.OutputText() != text.String() {
					t.Errorf("text %q (response %q), want the %d words sent", text.String(), end.Response.OutputText(), after)
				}
				// The job has ended (its stream did): no call can follow.
				if calls != 1 {
					t.Errorf("the provider got %d calls, want exactly 1", calls)
				}
				// The stream's end is stored before the job's result, so a
				// Get right after it may still find the response running.
				natstest.Eventually(t, 10*time.Second, func() error {
					g, err := n.sdk.Responses.Get(ctx, end.Response.ID, responses.ResponseGetParams{})
					if err != nil || g.Status != responses.ResponseStatusIncomplete {
						return fmt.Errorf("Get: %v status %q, want incomplete", err, g.Status)
					}
					return nil
				})
			})
		}
	}
}

// TestChatPassThrough: on /v1/chat/completions, a streamed tool call's
// deltas reach the caller as the provider sent them, and
// response_format json_schema reaches the provider unchanged.
func TestChatPassThrough(t *testing.T) {
	t.Parallel()
	n := startResponses(t, respBackends[1])
	ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
	defer cancel()
	tool := openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "get_weather", Parameters: openai.FunctionParameters{"type": "object"}})
	st := n.sdk.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: respModel, MaxTokens: openai.Int(32),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather?")}, Tools: []openai.ChatCompletionToolUnionParam{tool}})
	var acc openai.ChatCompletionAccumulator
	deltas := 0
	for st.Next() {
		c := st.Current()
		acc.AddChunk(c)
		if len(c.Choices) > 0 && len(c.Choices[0].Delta.ToolCalls) > 0 {
			deltas++
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(acc.Choices) != 1 || len(acc.Choices[0].Message.ToolCalls) != 1 {
		t.Fatalf("accumulated %+v, want one tool call", acc.Choices)
	}
	tc := acc.Choices[0].Message.ToolCalls[0]
	if tc.Function.Name != "get_weather" || tc.Function.Arguments != `{"n":1}` || !strings.HasPrefix(tc.ID, "call_") ||
		acc.Choices[0].FinishReason != "tool_calls" || deltas != 3 {
		t.Fatalf("tool call %+v finish %q in %d deltas, want get_weather {\"n\":1} (a name delta and two argument pieces), tool_calls", tc, acc.Choices[0].FinishReason, deltas)
	}

	schema := `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`
	body := fmt.Sprintf(`{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":"City?"}],"response_format":{"type":"json_schema","json_schema":{"name":"city","strict":true,"schema":%s}}}`, respModel, schema)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer acme-key")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got := respBackends[1].received(n.sim)
	var sent, want struct {
		ResponseFormat json.RawMessage `json:"response_format"`
	}
	_ = json.Unmarshal([]byte(body), &want)
	if err := json.Unmarshal(got[len(got)-1], &sent); err != nil || string(sent.ResponseFormat) != string(want.ResponseFormat) {
		t.Errorf("the provider got response_format %s, want %s", sent.ResponseFormat, want.ResponseFormat)
	}
}
