package sim_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/pkg/sim"
)

func sdk(url string) openai.Client {
	return openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
}

func params(prompt string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(40),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
}

// streamText reads a stream to its end with the official SDK.
func streamText(t *testing.T, c openai.Client, p openai.ChatCompletionNewParams, opts ...option.RequestOption) (string, int, *openai.CompletionUsage, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := c.Chat.Completions.NewStreaming(ctx, p, opts...)
	defer st.Close()
	var b strings.Builder
	var usage *openai.CompletionUsage
	chunks := 0
	for st.Next() {
		ch := st.Current()
		chunks++
		for _, choice := range ch.Choices {
			b.WriteString(choice.Delta.Content)
		}
		if ch.Usage.TotalTokens > 0 {
			u := ch.Usage
			usage = &u
		}
	}
	return b.String(), chunks, usage, st.Err()
}

// TestStreamMatchesUnstreamed: the same request, streamed, gives the same
// text as unstreamed, token by token, and the usage chunk when asked.
func TestStreamMatchesUnstreamed(t *testing.T) {
	t.Parallel()
	srv, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}, PerToken: time.Millisecond})
	c := sdk(url)
	whole, err := c.Chat.Completions.New(context.Background(), params("tell me"))
	if err != nil {
		t.Fatal(err)
	}
	p := params("tell me")
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	text, chunks, usage, err := streamText(t, c, p)
	if err != nil {
		t.Fatal(err)
	}
	if want := whole.Choices[0].Message.Content; text != want || text == "" {
		t.Errorf("streamed %q, want %q", text, want)
	}
	n := int(whole.Usage.CompletionTokens)
	if want := n + 3; chunks != want { // role, n tokens, finish, usage
		t.Errorf("%d chunks, want %d", chunks, want)
	}
	if usage == nil || usage.CompletionTokens != whole.Usage.CompletionTokens || usage.PromptTokens != whole.Usage.PromptTokens {
		t.Errorf("usage %+v, want %+v", usage, whole.Usage)
	}
	// Without include_usage, no usage chunk.
	if _, chunks, usage, err := streamText(t, c, params("tell me")); err != nil || usage != nil || chunks != n+2 {
		t.Errorf("without include_usage: %d chunks, usage %+v, err %v; want %d chunks and no usage", chunks, usage, err, n+2)
	}
	if st := srv.Stats(); st.Streamed != 2 || st.Completed != 3 {
		t.Errorf("streamed %d, completed %d; want 2 and 3", st.Streamed, st.Completed)
	}
}

// TestStreamFaults: a cut after N tokens is an error for the client (the
// connection breaks without [DONE]) and one completion; a cut before the
// first token is none; MaxFaults bounds the faults; a stall holds the
// stream silent until the client gives up.
func TestStreamFaults(t *testing.T) {
	t.Parallel()
	cut, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}, Faults: sim.Faults{RateStreamCut: 1, StreamCutAfter: 3, MaxFaults: 1}})
	c := sdk(url)
	text, _, _, err := streamText(t, c, params("a"), option.WithHeader("X-Sluice-Job-Id", "j1"))
	if err == nil {
		t.Errorf("a cut stream ended without an error (text %q)", text)
	}
	if got := len(strings.Fields(text)); got != 3 {
		t.Errorf("cut stream delivered %d words, want 3", got)
	}
	if _, _, _, err := streamText(t, c, params("a")); err != nil {
		t.Errorf("after MaxFaults, a stream failed: %v", err)
	}
	if st := cut.Stats(); st.StreamCuts != 1 || st.JobCompletions["j1"] != 1 || st.Completed != 2 {
		t.Errorf("cuts %d, completions of j1 %d, completed %d; want 1, 1, 2", st.StreamCuts, st.JobCompletions["j1"], st.Completed)
	}
	// Unstreamed requests never draw a stream fault.
	if _, err := c.Chat.Completions.New(context.Background(), params("b")); err != nil {
		t.Errorf("unstreamed request: %v", err)
	}

	early, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}, Faults: sim.Faults{RateStreamCut: 1}})
	if text, _, _, err := streamText(t, sdk(url), params("a")); err == nil || text != "" {
		t.Errorf("cut before the first token: text %q, err %v; want no text and an error", text, err)
	}
	if st := early.Stats(); st.Completed != 0 || st.StreamCuts != 1 {
		t.Errorf("cut before the first token: completed %d, cuts %d; want 0, 1", st.Completed, st.StreamCuts)
	}

	stall, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}, Faults: sim.Faults{RateStreamStall: 1, StreamStallAfter: 2}})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	sc := sdk(url)
	st := sc.Chat.Completions.NewStreaming(ctx, params("a"))
	words := 0
	for st.Next() {
		words += len(strings.Fields(st.Current().Choices[0].Delta.Content))
	}
	if st.Err() == nil || words != 2 {
		t.Errorf("stall: %d words, err %v; want 2 and an error when the client gives up", words, st.Err())
	}
	st.Close()
	if s := stall.Stats(); s.StreamStalls != 1 {
		t.Errorf("stalls %d, want 1", s.StreamStalls)
	}
}

// TestStreamReplay: a streamed request whose Idempotency-Key completed is
// replayed as a stream with the same text.
func TestStreamReplay(t *testing.T) {
	t.Parallel()
	srv, url := start(t, sim.Config{Models: []sim.ModelLimits{{Name: model}}})
	c := sdk(url)
	first, _, _, err := streamText(t, c, params("x"), option.WithHeader("Idempotency-Key", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	again, _, _, err := streamText(t, c, params("x"), option.WithHeader("Idempotency-Key", "k1"))
	if err != nil || again != first {
		t.Errorf("replay %q (err %v), want %q", again, err, first)
	}
	if st := srv.Stats(); st.Completed != 1 || st.Replayed != 1 {
		t.Errorf("completed %d, replayed %d; want 1, 1", st.Completed, st.Replayed)
	}
}
