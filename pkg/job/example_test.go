package job_test

import (
	"fmt"

	"github.com/sluice-dev/sluice/pkg/job"
)

func ExampleDecode() {
	data := []byte(`{"tenant":"acme","request":{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":0}}`)
	_, err := job.Decode(data, job.DefaultLimits)
	fmt.Println(err)
	// Output: request.max_tokens: must be positive, got 0
}

func ExampleDispatchSubject() {
	fmt.Println(job.ModelToken("gpt-4.1-mini"))
	fmt.Println(job.DispatchSubject("openai", "gpt-4.1-mini"))
	// Output:
	// gpt-4_1-mini
	// sluice.dispatch.openai.gpt-4_1-mini
}
