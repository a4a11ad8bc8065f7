package tokens_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/tiktoken-go/tokenizer"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// msg builds a message with string content.
func msg(role, name, content string) job.ChatMessage {
	c, _ := json.Marshal(content)
	return job.ChatMessage{Role: role, Name: name, Content: c}
}

// cookbookMessages is the example of OpenAI's cookbook "How to count tokens
// with tiktoken", whose prompt_tokens the API reported as 129 for gpt-4 and
// gpt-3.5-turbo (cl100k_base) and 124 for gpt-4o and gpt-4o-mini (o200k_base).
var cookbookMessages = []job.ChatMessage{
	msg("system", "", "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."),
	msg("system", "example_user", "New synergies will help drive top-line growth."),
	msg("system", "example_assistant", "Things working well together will increase revenue."),
	msg("system", "example_user", "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."),
	msg("system", "example_assistant", "Let's talk later when we're less busy about how to do better."),
	msg("user", "", "This late pivot means we don't have time to boil the ocean for the client deliverable."),
}

func codec(t testing.TB, enc tokenizer.Encoding) tokenizer.Codec {
	t.Helper()
	c, err := tokenizer.Get(enc)
	if err != nil {
		t.Fatalf("tokenizer.Get(%s): %v", enc, err)
	}
	return c
}

func count(t testing.TB, c tokenizer.Codec, s string) int {
	t.Helper()
	n, err := c.Count(s)
	if err != nil {
		t.Fatalf("Count(%q): %v", s, err)
	}
	return n
}

// cookbook computes OpenAI's documented count directly with the tokenizer:
// 3 per message, the tokens of every value, 1 more per name, 3 to prime the
// reply.
func cookbook(t testing.TB, enc tokenizer.Encoding, msgs []job.ChatMessage) int {
	t.Helper()
	c := codec(t, enc)
	n := 3
	for _, m := range msgs {
		n += 3 + count(t, c, m.Role) + count(t, c, m.Text())
		if m.Name != "" {
			n += 1 + count(t, c, m.Name)
		}
	}
	return n
}

func TestKnownCounts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		enc  tokenizer.Encoding
		text string
		want int
	}{
		{tokenizer.O200kBase, "hello world", 2},
		{tokenizer.Cl100kBase, "hello world", 2},
		{tokenizer.Cl100kBase, "tiktoken is great!", 6}, // the cookbook's example: t, ik, token, " is", " great", !
		{tokenizer.O200kBase, "", 0},
	} {
		if got := count(t, codec(t, tc.enc), tc.text); got != tc.want {
			t.Errorf("%s %q: got %d tokens, want %d", tc.enc, tc.text, got, tc.want)
		}
	}
	if got, want := tokens.Count("gpt-4o", "hello world"), 2; got != want {
		t.Errorf("Count(gpt-4o, hello world): got %d, want %d", got, want)
	}
}

func TestPromptMatchesCookbook(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		model string
		enc   tokenizer.Encoding
		// api is what the OpenAI API reported for cookbookMessages.
		api int
	}{
		{"gpt-4o", tokenizer.O200kBase, 124},
		{"gpt-4o-mini", tokenizer.O200kBase, 124},
		{"gpt-4", tokenizer.Cl100kBase, 129},
		{"gpt-4-0613", tokenizer.Cl100kBase, 129},
		{"gpt-3.5-turbo", tokenizer.Cl100kBase, 129},
	} {
		t.Run(tc.model, func(t *testing.T) {
			t.Parallel()
			got := tokens.Prompt(&job.ChatRequest{Model: tc.model, Messages: cookbookMessages})
			if want := cookbook(t, tc.enc, cookbookMessages); got != want {
				t.Errorf("Prompt: got %d, want %d computed with %s", got, want, tc.enc)
			}
			if got != tc.api {
				t.Errorf("Prompt: got %d, want %d as the API reported", got, tc.api)
			}
		})
	}
}

func TestPromptShortChat(t *testing.T) {
	t.Parallel()
	req := &job.ChatRequest{Model: "gpt-4o", Messages: []job.ChatMessage{
		msg("system", "", "You are terse."),
		msg("user", "", "hello world"),
	}}
	c := codec(t, tokenizer.O200kBase)
	// 3 reply priming + per message (3 + role + content).
	want := 3 + (3 + count(t, c, "system") + count(t, c, "You are terse.")) + (3 + count(t, c, "user") + 2)
	if got := tokens.Prompt(req); got != want {
		t.Errorf("Prompt: got %d, want %d", got, want)
	}
	if got, want := tokens.Prompt(&job.ChatRequest{Model: "gpt-4o"}), 3; got != want {
		t.Errorf("Prompt of no messages: got %d, want %d (reply priming only)", got, want)
	}
}

func TestEncoding(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		model     string
		want      tokenizer.Encoding
		wantExact bool
	}{
		{"gpt-4o", tokenizer.O200kBase, true},
		{"gpt-4o-mini-2024-07-18", tokenizer.O200kBase, true},
		{"GPT-4o", tokenizer.O200kBase, true},
		{"openai/gpt-4o", tokenizer.O200kBase, true},
		{"gpt-4.1-mini", tokenizer.O200kBase, true},
		{"gpt-5", tokenizer.O200kBase, true},
		{"o1-mini", tokenizer.O200kBase, true},
		{"o3", tokenizer.O200kBase, true},
		{"o4-mini", tokenizer.O200kBase, true},
		{"chatgpt-4o-latest", tokenizer.O200kBase, true},
		{"gpt-oss-120b", tokenizer.O200kBase, true},
		{"gpt-4", tokenizer.Cl100kBase, true},
		{"gpt-4-turbo", tokenizer.Cl100kBase, true},
		{"gpt-3.5-turbo", tokenizer.Cl100kBase, true},
		{"gpt-35-turbo", tokenizer.Cl100kBase, true},
		{"claude-3-5-sonnet", tokenizer.O200kBase, false},
		{"llama-3.1-8b", tokenizer.O200kBase, false},
		{"", tokenizer.O200kBase, false},
	} {
		got, exact := tokens.Encoding(tc.model)
		if got != tc.want || exact != tc.wantExact {
			t.Errorf("Encoding(%q): got %s, %v, want %s, %v", tc.model, got, exact, tc.want, tc.wantExact)
		}
	}
}

func TestCountUsesModelEncoding(t *testing.T) {
	t.Parallel()
	// A text whose count differs between the two encodings.
	text := strings.Repeat("Здравствуйте, мир! 你好世界 ", 20)
	o200 := count(t, codec(t, tokenizer.O200kBase), text)
	cl100 := count(t, codec(t, tokenizer.Cl100kBase), text)
	if o200 == cl100 {
		t.Fatalf("test text counts the same in both encodings (%d); pick another", o200)
	}
	for _, tc := range []struct {
		model string
		want  int
	}{{"gpt-4o", o200}, {"gpt-4", cl100}, {"gpt-3.5-turbo", cl100}, {"claude-3-5-sonnet", o200}} {
		if got := tokens.Count(tc.model, text); got != tc.want {
			t.Errorf("Count(%s): got %d, want %d", tc.model, got, tc.want)
		}
	}
}

func TestPromptFallback(t *testing.T) {
	t.Parallel()
	proxy := tokens.Prompt(&job.ChatRequest{Model: "gpt-4o", Messages: cookbookMessages})
	got := tokens.Prompt(&job.ChatRequest{Model: "claude-3-5-sonnet", Messages: cookbookMessages})
	if got < proxy {
		t.Errorf("Prompt(claude-3-5-sonnet): got %d, want at least the o200k count %d", got, proxy)
	}
	// 124 * 1.15 = 142.6, rounded up.
	if want := 143; got != want {
		t.Errorf("Prompt(claude-3-5-sonnet): got %d, want %d (o200k count %d × %g, rounded up)", got, want, proxy, tokens.FallbackFactor)
	}
	if want := int(float64(proxy)*tokens.FallbackFactor + 0.999); got != want {
		t.Errorf("Prompt(claude-3-5-sonnet): got %d, want %d", got, want)
	}
}

func TestPromptArrayContent(t *testing.T) {
	t.Parallel()
	parts := job.ChatMessage{Role: "user", Content: json.RawMessage(`[{"type":"text","text":"hello "},{"type":"image_url","image_url":{"url":"https://example.test/a.png"}},{"type":"text","text":"world"}]`)}
	got := tokens.Prompt(&job.ChatRequest{Model: "gpt-4o", Messages: []job.ChatMessage{parts}})
	want := tokens.Prompt(&job.ChatRequest{Model: "gpt-4o", Messages: []job.ChatMessage{msg("user", "", "hello world")}})
	// The image part, of a size Sluice cannot read, is charged as a
	// 1024×1024 one at detail auto.
	if img := tokens.ImageTokens(1024, 1024, "auto"); got != want+img {
		t.Errorf("Prompt of text parts and an image: got %d, want %d as for the same string content + %d for the image", got, want, img)
	}
}

func TestPromptNameAddsTokens(t *testing.T) {
	t.Parallel()
	c := codec(t, tokenizer.O200kBase)
	without := tokens.Prompt(&job.ChatRequest{Model: "gpt-4o", Messages: []job.ChatMessage{msg("user", "", "hi")}})
	with := tokens.Prompt(&job.ChatRequest{Model: "gpt-4o", Messages: []job.ChatMessage{msg("user", "example_user", "hi")}})
	if got, want := with-without, 1+count(t, c, "example_user"); got != want {
		t.Errorf("a name adds: got %d tokens, want %d", got, want)
	}
}

// The cookbook's weather tool: the API reported 101 prompt tokens for gpt-4o.
const weatherTools = `[{"type":"function","function":{"name":"get_current_weather","description":"Get the current weather in a given location","parameters":{"type":"object","properties":{"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},"unit":{"type":"string","description":"The unit of temperature to return","enum":["celsius","fahrenheit"]}},"required":["location"]}}}]`

func TestPromptTools(t *testing.T) {
	t.Parallel()
	msgs := []job.ChatMessage{
		msg("system", "", "You are a helpful assistant that can answer to questions about the weather."),
		msg("user", "", "What's the weather like in San Francisco?"),
	}
	without := tokens.Prompt(&job.ChatRequest{Model: "gpt-4o", Messages: msgs})
	with := tokens.Prompt(&job.ChatRequest{Model: "gpt-4o", Messages: msgs, Tools: json.RawMessage(weatherTools)})
	if with <= without {
		t.Errorf("tools: got %d with and %d without, want tools to add tokens", with, without)
	}
	if got, want := with-without, count(t, codec(t, tokenizer.O200kBase), weatherTools); got != want {
		t.Errorf("tools add: got %d, want %d (their JSON's tokens)", got, want)
	}
	// Counting the JSON over-estimates what the API charges; it must never
	// fall below it.
	if api := 101; with < api {
		t.Errorf("Prompt with tools: got %d, want at least the %d the API reported", with, api)
	}
	t.Logf("weather example with tools: estimate %d, API 101", with)
}

func TestPromptConcurrent(t *testing.T) {
	t.Parallel()
	req := &job.ChatRequest{Model: "gpt-4o", Messages: cookbookMessages}
	want := tokens.Prompt(req)
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for i := range 8 {
		model := []string{"gpt-4o", "gpt-4", "claude-3-5-sonnet", "gpt-3.5-turbo"}[i%4]
		wg.Go(func() {
			r := &job.ChatRequest{Model: model, Messages: cookbookMessages}
			first := tokens.Prompt(r)
			for range 20 {
				if got := tokens.Prompt(r); got != first {
					errs <- fmt.Sprintf("%s: got %d, want %d", model, got, first)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if got := tokens.Prompt(req); got != want {
		t.Errorf("Prompt after concurrent use: got %d, want %d", got, want)
	}
}

// longPrompt is a chat of roughly 4,000 o200k tokens.
func longPrompt(tb testing.TB) *job.ChatRequest {
	tb.Helper()
	para := "Sluice queues chat-completion requests durably, admits them fairly under every limit that applies, " +
		"and calls the provider with bounded, classified retries; overload becomes visible queue depth. "
	var msgs []job.ChatMessage
	msgs = append(msgs, msg("system", "", "You summarise design documents for engineers."))
	for i := range 20 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg(role, "", fmt.Sprintf("Part %d. %s", i, strings.Repeat(para, 5))))
	}
	return &job.ChatRequest{Model: "gpt-4o", Messages: msgs}
}

func TestLongPromptSize(t *testing.T) {
	t.Parallel()
	n := tokens.Prompt(longPrompt(t))
	if n < 3500 || n > 4500 {
		t.Errorf("long prompt: got %d tokens, want about 4,000", n)
	}
}

func BenchmarkPrompt(b *testing.B) {
	req := longPrompt(b)
	n := tokens.Prompt(req)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		tokens.Prompt(req)
	}
	b.ReportMetric(float64(n), "tokens/op")
}
