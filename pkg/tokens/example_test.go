package tokens_test

import (
	"fmt"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

func ExamplePrompt() {
	req, _ := job.ParseRequest([]byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hello world"}]}`), job.DefaultLimits)
	// 3 to prime the reply + 3 for the message + 1 for "user" + 2 for "hello world"
	fmt.Println(tokens.Prompt(req))
	// Output: 9
}
