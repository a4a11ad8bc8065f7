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
