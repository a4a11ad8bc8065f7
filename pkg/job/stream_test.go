package job_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/job"
)

func TestStreamRequestAccepted(t *testing.T) {
	t.Parallel()
	r, err := job.ParseRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`), job.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Stream || !r.WantsUsage() {
		t.Errorf("stream %v, wants usage %v; want both true", r.Stream, r.WantsUsage())
	}
}

// TestTranscriptRoundTrip assembles chunks into a completion, renders the
// completion as chunks again, and assembles those: the same answer.
func TestTranscriptRoundTrip(t *testing.T) {
	t.Parallel()
	chunks := []string{
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":" world"},"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"a\""}}]},"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`,
	}
	var tr job.Transcript
	for i, c := range chunks {
		var ch job.Chunk
		if err := json.Unmarshal([]byte(c), &ch); err != nil {
			t.Fatal(err)
		}
		if got, want := ch.HasOutput(), i >= 1 && i <= 4; got != want {
			t.Errorf("chunk %d: HasOutput %v, want %v", i, got, want)
		}
		if i == 0 && tr.Started() {
			t.Error("started before any output")
		}
		tr.Add(&ch)
	}
	if got, want := tr.Text(), "Hello world"; got != want {
		t.Errorf("text %q, want %q", got, want)
	}
	if u := tr.Usage(); u == nil || u.TotalTokens != 8 {
		t.Errorf("usage %+v, want 8 total tokens", u)
	}
	body := tr.Completion()
	if !strings.Contains(string(body), `"arguments":"{\"a\":1}"`) || !strings.Contains(string(body), `"finish_reason":"tool_calls"`) {
		t.Errorf("completion %s lacks the tool call or the finish reason", body)
	}
	var again job.Transcript
	for _, c := range job.CompletionChunks(body, true) {
		var ch job.Chunk
		if err := json.Unmarshal(c, &ch); err != nil {
			t.Fatal(err)
		}
		again.Add(&ch)
	}
	if got, want := string(again.Completion()), string(body); got != want {
		t.Errorf("round trip:\n got %s\nwant %s", got, want)
	}
}

func TestWithMembers(t *testing.T) {
	t.Parallel()
	base := `{"messages":[{"role":"user","content":"a, \"stream\": b"}],"model":"m","max_tokens":32}`
	for _, tc := range []struct{ in, want string }{
		{base, base},
		{`{"messages":[{"role":"user","content":"a, \"stream\": b"}],"model":"m","max_tokens":32,"stream":true}`, base},
		{`{"stream":true,"messages":[{"role":"user","content":"a, \"stream\": b"}],"model":"m","stream_options":{"include_usage":false},"max_tokens":32}`, base},
		{`{ "stream" : true , "model":"m"}`, `{"model":"m"}`},
		{`[1,2]`, `[1,2]`},
		{`{"stream":true}`, `{}`},
	} {
		if got := string(job.WithoutMembers([]byte(tc.in), "stream", "stream_options")); got != tc.want {
			t.Errorf("WithoutMembers(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
	got := string(job.WithMember([]byte(`{"model":"m","stream_options":{"include_usage":false},"stream":true}`), "stream_options", json.RawMessage(`{"include_usage":true}`)))
	if want := `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`; got != want {
		t.Errorf("WithMember = %s, want %s", got, want)
	}
	if got := string(job.WithMember([]byte(`{}`), "a", json.RawMessage(`1`))); got != `{"a":1}` {
		t.Errorf("WithMember on {} = %s", got)
	}
}

// TestChunkUsageCacheWrite: a stream's usage chunk from an Anthropic
// provider carries what it wrote to its cache, as a non-streamed answer's
// usage does (its cost and the prompt-cache record depend on it); never
// more than the prompt not read from the cache.
func TestChunkUsageCacheWrite(t *testing.T) {
	for _, tc := range []struct {
		chunk string
		want  job.Usage
	}{
		{`{"prompt_tokens":3020,"completion_tokens":30,"total_tokens":3050,"cache_creation_input_tokens":3000}`,
			job.Usage{PromptTokens: 3020, CompletionTokens: 30, TotalTokens: 3050, CacheWriteTokens: 3000}},
		{`{"prompt_tokens":3205,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":3000},"cache_creation_input_tokens":900}`,
			job.Usage{PromptTokens: 3205, CompletionTokens: 1, TotalTokens: 3206, CachedTokens: 3000, CacheWriteTokens: 205}},
		{`{"prompt_tokens":10,"completion_tokens":2}`, job.Usage{PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12}},
	} {
		var u job.ChunkUsage
		if err := json.Unmarshal([]byte(tc.chunk), &u); err != nil {
			t.Fatal(err)
		}
		if got := u.Usage(); got != tc.want {
			t.Errorf("%s: usage %+v, want %+v", tc.chunk, got, tc.want)
		}
	}
}
