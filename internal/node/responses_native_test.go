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

	"github.com/sluice-dev/sluice/pkg/sim"
)

var webSearch = responses.ToolParamOfWebSearch(responses.WebSearchToolTypeWebSearch)

// The simulator's body for a call, decoded.
type upstreamBody struct {
	Input   []json.RawMessage `json:"input"`
	Tools   []json.RawMessage `json:"tools"`
	Include []string          `json:"include"`
	Choice  json.RawMessage   `json:"tool_choice"`
}

func lastUpstream(t *testing.T, n respNode) upstreamBody {
	t.Helper()
	got := respBackends[0].received(n.sim)
	var b upstreamBody
	if err := json.Unmarshal(got[len(got)-1], &b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestResponsesNativeItems: to a provider serving the Responses API
// natively, reasoning items (with their encrypted content) and built-in
// tools pass through both ways, streamed or not, and a conversation
// chained by previous_response_id sends the reasoning back; the input
// items of a stored response list the conversation, a page at a time.
func TestResponsesNativeItems(t *testing.T) {
	t.Parallel()
	b := respBackends[0]
	b.sim.Models = []sim.ModelLimits{{Name: respModel, RPM: 100000, TPM: 10000000, Reasoning: true}}
	n := startResponses(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
	defer cancel()
	include := []responses.ResponseIncludable{responses.ResponseIncludableReasoningEncryptedContent}

	// A built-in tool and the reasoning's encrypted content: the provider
	// gets both as sent, and its reasoning and web_search_call come back.
	r1, err := n.sdk.Responses.New(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32), Include: include,
		Tools: []responses.ToolUnionParam{webSearch}, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Search the news.")}})
	if err != nil {
		t.Fatalf("Responses.New with web_search: %v", err)
	}
	up := lastUpstream(t, n)
	if len(up.Tools) != 1 || !strings.Contains(string(up.Tools[0]), `"web_search"`) || len(up.Include) != 1 || up.Include[0] != "reasoning.encrypted_content" {
		t.Errorf("the provider got tools %s include %v, want web_search and reasoning.encrypted_content", up.Tools, up.Include)
	}
	if len(r1.Output) != 3 || r1.Output[0].Type != "reasoning" || r1.Output[1].Type != "web_search_call" || r1.Output[2].Type != "message" || r1.OutputText() == "" {
		t.Fatalf("output %s, want reasoning, web_search_call, message", r1.RawJSON())
	}
	enc := r1.Output[0].AsReasoning().EncryptedContent
	if !strings.HasPrefix(enc, "enc_") || r1.Output[1].AsWebSearchCall().Status != "completed" {
		t.Fatalf("reasoning %q, web search %+v: want the provider's encrypted content and a completed call", enc, r1.Output[1])
	}

	// The follow-up sends the reasoning back, encrypted content and all,
	// and the web search call; a reasoning item the caller passes is sent
	// unchanged, but for one without encrypted content, which names
	// reasoning nothing kept (the call is store false: the simulator, as
	// OpenAI, refuses it).
	mine := responses.ResponseInputItemParamOfReasoning("rs_mine", []responses.ResponseReasoningItemSummaryParam{})
	mine.OfReasoning.EncryptedContent = openai.String("enc_mine")
	gone := responses.ResponseInputItemParamOfReasoning("rs_gone", []responses.ResponseReasoningItemSummaryParam{})
	r2, err := n.sdk.Responses.New(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32), PreviousResponseID: openai.String(r1.ID),
		Include: include, Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{gone, mine,
			responses.ResponseInputItemParamOfMessage("And then?", responses.EasyInputMessageRoleUser)}}})
	if err != nil {
		t.Fatalf("follow-up: %v", err)
	}
	up = lastUpstream(t, n)
	var types []string
	for _, it := range up.Input {
		var v struct {
			Type string `json:"type"`
		}
		if _ = json.Unmarshal(it, &v); v.Type == "" {
			v.Type = "message" // an easy message, as the caller sent it
		}
		types = append(types, v.Type)
	}
	all := fmt.Sprint(types)
	if all != "[message reasoning web_search_call message reasoning message]" || !strings.Contains(string(up.Input[1]), enc) ||
		!strings.Contains(string(up.Input[4]), `"encrypted_content":"enc_mine"`) || !strings.Contains(string(up.Input[4]), `"rs_mine"`) {
		t.Fatalf("the follow-up's input %s, want the first turn, its reasoning (with %s), search and answer, then the new reasoning and message", up.Input, enc)
	}

	// Streamed: each item arrives as output_item.done, and in the final
	// response.
	st := n.sdk.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32), Include: include,
		Tools: []responses.ToolUnionParam{webSearch}, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Stream a search.")},
		ToolChoice: responses.ResponseNewParamsToolChoiceUnion{OfHostedTool: &responses.ToolChoiceTypesParam{Type: responses.ToolChoiceTypesTypeWebSearchPreview}}})
	var doneItems []string
	var final responses.Response
	for st.Next() {
		switch ev := st.Current(); ev.Type {
		case "response.output_item.done":
			doneItems = append(doneItems, ev.Item.Type)
		case "response.completed":
			final = ev.Response
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if fmt.Sprint(doneItems) != "[reasoning web_search_call message]" || len(final.Output) != 3 || !strings.HasPrefix(final.Output[0].AsReasoning().EncryptedContent, "enc_") {
		t.Fatalf("streamed items %v, final output %s: want reasoning (encrypted), web_search_call, message", doneItems, final.RawJSON())
	}
	if c := string(lastUpstream(t, n).Choice); c != `{"type":"web_search_preview"}` {
		t.Errorf("the provider got tool_choice %s, want the built-in tool's as sent", c)
	}
	g, err := n.sdk.Responses.Get(ctx, final.ID, responses.ResponseGetParams{})
	if err != nil || len(g.Output) != 3 || g.Output[0].AsReasoning().EncryptedContent != final.Output[0].AsReasoning().EncryptedContent {
		t.Fatalf("Get of the streamed response: %v %s, want its reasoning kept", err, g.RawJSON())
	}

	// The input items of the follow-up: the whole conversation, newest
	// first, two at a time.
	var listed []responses.ResponseItemUnion
	pager := n.sdk.Responses.InputItems.ListAutoPaging(ctx, r2.ID, responses.InputItemListParams{Limit: openai.Int(2)})
	for pager.Next() {
		listed = append(listed, pager.Current())
	}
	if err := pager.Err(); err != nil {
		t.Fatalf("input items: %v", err)
	}
	var kinds []string
	ids := map[string]bool{}
	for _, it := range listed {
		kinds = append(kinds, it.Type)
		ids[it.ID] = true
	}
	if fmt.Sprint(kinds) != "[message reasoning reasoning message web_search_call reasoning message]" || len(ids) != 7 || listed[2].ID != "rs_gone" {
		t.Fatalf("input items %v (%d ids), want the conversation newest first, each with its own id", kinds, len(ids))
	}
	if m := listed[0].AsMessage(); len(m.Content) != 1 || m.Content[0].Text != "And then?" || m.Role != "user" {
		t.Errorf("newest item %+v, want the user's message as an input_text part", listed[0])
	}
	if listed[5].AsReasoning().EncryptedContent != enc {
		t.Errorf("the first turn's reasoning %s, want it with its encrypted content", listed[4].RawJSON())
	}
	asc, err := n.sdk.Responses.InputItems.List(ctx, r1.ID, responses.InputItemListParams{Order: responses.InputItemListParamsOrderAsc})
	if err != nil || len(asc.Data) != 1 || asc.Data[0].AsMessage().Content[0].Text != "Search the news." || asc.HasMore {
		t.Fatalf("input items of the first response: %v %+v, want its one message", err, asc)
	}
	globex := openai.NewClient(option.WithBaseURL(n.base+"/v1"), option.WithAPIKey("globex-key"), option.WithMaxRetries(0))
	if _, err := globex.Responses.InputItems.List(ctx, r2.ID, responses.InputItemListParams{}); !isStatus(err, http.StatusNotFound) {
		t.Errorf("input items by another tenant: %v, want 404", err)
	}
	if err := n.sdk.Responses.Delete(ctx, r2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := n.sdk.Responses.InputItems.List(ctx, r2.ID, responses.InputItemListParams{}); !isStatus(err, http.StatusNotFound) {
		t.Errorf("input items after Delete: %v, want 404", err)
	}
	if _, err := n.sdk.Responses.InputItems.List(ctx, r1.ID, responses.InputItemListParams{Limit: openai.Int(101)}); !isStatus(err, http.StatusBadRequest) {
		t.Errorf("limit 101: %v, want 400", err)
	}
}

// TestResponsesTranslatedItems: a model translated to chat or Anthropic
// Messages refuses a built-in tool by name, and drops reasoning items
// (and ignores include) deliberately.
func TestResponsesTranslatedItems(t *testing.T) {
	t.Parallel()
	for _, b := range respBackends[1:] {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			n := startResponses(t, b)
			ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
			defer cancel()
			_, err := n.sdk.Responses.New(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32),
				Tools: []responses.ToolUnionParam{weather, webSearch}, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Search.")}})
			var apiErr *openai.Error
			if !isStatus(err, http.StatusBadRequest) || !errors.As(err, &apiErr) || apiErr.Param != "tools[1].type" || !strings.Contains(apiErr.Message, `"web_search"`) {
				t.Fatalf("web_search on a translated model: %v, want 400 naming tools[1].type and web_search", err)
			}
			_, err = n.sdk.Responses.New(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32),
				ToolChoice: responses.ResponseNewParamsToolChoiceUnion{OfHostedTool: &responses.ToolChoiceTypesParam{Type: responses.ToolChoiceTypesTypeWebSearchPreview}},
				Input:      responses.ResponseNewParamsInputUnion{OfString: openai.String("Search.")}})
			if !isStatus(err, http.StatusBadRequest) || !errors.As(err, &apiErr) || apiErr.Param != "tool_choice" {
				t.Fatalf("tool_choice web_search_preview on a translated model: %v, want 400 naming tool_choice", err)
			}
			if got := b.received(n.sim); len(got) != 0 {
				t.Fatalf("the provider got %d calls, want none", len(got))
			}
			mine := responses.ResponseInputItemParamOfReasoning("rs_mine", []responses.ResponseReasoningItemSummaryParam{})
			mine.OfReasoning.EncryptedContent = openai.String("enc_mine")
			r, err := n.sdk.Responses.New(ctx, responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(32),
				Include: []responses.ResponseIncludable{responses.ResponseIncludableReasoningEncryptedContent},
				Input:   responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{mine, responses.ResponseInputItemParamOfMessage("Hi.", responses.EasyInputMessageRoleUser)}}})
			if err != nil || r.OutputText() == "" {
				t.Fatalf("reasoning item on a translated model: %v, want an answer", err)
			}
			got := b.received(n.sim)
			if last := string(got[len(got)-1]); strings.Contains(last, "enc_mine") || strings.Contains(last, "rs_mine") || !strings.Contains(last, "Hi.") {
				t.Errorf("the provider got %s, want the message without the reasoning item", last)
			}
		})
	}
}
