package sim_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// A simulated provider on loopback, one chat completion against it, and
// what its limits charged: one request, and the prompt plus the whole output
// limit (10 + 64 tokens) at arrival, whatever the completion used.
func Example() {
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 60, TPM: 10000}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	ts := httptest.NewServer(s) // 127.0.0.1, a free port
	defer ts.Close()

	body := `{"model":"gpt-4o-mini","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}`
	resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	var out struct {
		Object string `json:"object"`
		Usage  struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(resp.Status, out.Object)
	fmt.Println("usage:", out.Usage.PromptTokens, "prompt,", out.Usage.CompletionTokens, "completion")
	fmt.Println("requests left this minute:", resp.Header.Get("x-ratelimit-remaining-requests"))
	fmt.Println("tokens left this minute:", resp.Header.Get("x-ratelimit-remaining-tokens"))
	// Output:
	// 200 OK chat.completion
	// usage: 10 prompt, 23 completion
	// requests left this minute: 59
	// tokens left this minute: 9926
}

// An Anthropic message batch against the simulator: its requests are
// answered as /v1/messages would answer them (here at once: no
// BatchConfig.Duration), outside the rate limits, and the ledger says what
// each line was billed.
func ExampleServer_BatchLines() {
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: "claude-3-5-haiku-latest", RPM: 50, ITPM: 10000, OTPM: 2000}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	ts := httptest.NewServer(s)
	defer ts.Close()

	body := `{"requests":[
		{"custom_id":"a","params":{"model":"claude-3-5-haiku-latest","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}},
		{"custom_id":"b","params":{"model":"claude-3-5-haiku-latest","max_tokens":0,"messages":[{"role":"user","content":"hello"}]}}]}`
	req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/messages/batches", strings.NewReader(body))
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println("create:", resp.Status)
	for _, l := range s.BatchLines() {
		fmt.Println(l.CustomID, l.Result, "billed", l.InputTokens, "in,", l.OutputTokens, "out")
	}
	// Output:
	// create: 200 OK
	// a succeeded billed 5 in, 20 out
	// b errored billed 0 in, 0 out
}
