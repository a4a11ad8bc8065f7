package systest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestReasoningModelThroughSluice: a reasoning model (it refuses
// max_tokens) receives max_completion_tokens exactly as the caller sent it,
// through the whole mesh, and the reasoning tokens it reports come back in
// the usage, inside the output tokens.
func TestReasoningModelThroughSluice(t *testing.T) {
	t.Parallel()
	seen := &Judged{}
	_, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "o4-mini", RPM: 1000, TPM: 1_000_000, Reasoning: true}},
		APIKeys: []string{"sim-secret"}, OnArrival: seen.Add})
	n := Start(t, SimConfig(simURL, "o4-mini", 1000, 1_000_000, ""), Env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	body := []byte(`{"model":"o4-mini","max_completion_tokens":300,"reasoning_effort":"low","messages":[{"role":"user","content":"Think, then say hi."}]}`)
	r, err := cl.Do(ctx, &job.Job{Tenant: "acme", Request: body})
	if err != nil || r.Status != job.StatusSucceeded {
		t.Fatalf("job: %v %+v, want succeeded", err, r)
	}
	if u := r.Usage; u == nil || u.ReasoningTokens <= 0 || u.ReasoningTokens > u.CompletionTokens {
		t.Errorf("usage %+v: want reasoning tokens reported inside the completion tokens", r.Usage)
	}
	got := seen.All()
	if len(got) != 1 {
		t.Fatalf("the provider saw %d calls, want 1", len(got))
	}
	var sent map[string]json.RawMessage
	if err := json.Unmarshal(got[0].Body, &sent); err != nil {
		t.Fatal(err)
	}
	if string(sent["max_completion_tokens"]) != "300" || sent["max_tokens"] != nil || string(sent["reasoning_effort"]) != `"low"` {
		t.Errorf("the provider received %s, want max_completion_tokens 300 and reasoning_effort as sent, no max_tokens", got[0].Body)
	}
	// Reserved by max_completion_tokens: the provider's charge is its
	// prompt count + 300.
	if c := got[0].Cost; c < 300 || c > 400 {
		t.Errorf("the provider charged %d tokens, want its prompt count + 300", c)
	}
}

// TestImagesAndToolsReserved: an image part and tool definitions are part
// of the prompt Sluice reserves, as OpenAI charges them.
func TestImagesAndToolsReserved(t *testing.T) {
	t.Parallel()
	_, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 1000, TPM: 1_000_000}}, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 1000, 1_000_000, ""), Env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reserved := func(body string) float64 {
		t.Helper()
		before := scrape(t, n.MetricsURL()+"/metrics")
		r, err := cl.Do(ctx, &job.Job{Tenant: "acme", Request: []byte(body)})
		if err != nil || r.Status != job.StatusSucceeded {
			t.Fatalf("job: %v %+v", err, r)
		}
		b, _ := sum(before, "llm_tokens_reserved_total", `model="gpt-4o-mini"`)
		a, _ := sum(scrape(t, n.MetricsURL()+"/metrics"), "llm_tokens_reserved_total", `model="gpt-4o-mini"`)
		return a - b
	}
	plain := reserved(`{"model":"gpt-4o-mini","max_tokens":10,"messages":[{"role":"user","content":"Describe this."}]}`)
	image := reserved(`{"model":"gpt-4o-mini","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"Describe this."},{"type":"image_url","image_url":{"url":"https://example.test/cat.png","detail":"high"}}]}]}`)
	tools := reserved(`{"model":"gpt-4o-mini","max_tokens":10,"messages":[{"role":"user","content":"Describe this."}],"tools":[{"type":"function","function":{"name":"describe","description":"` + strings.Repeat("Describe the picture in detail. ", 20) + `"}}]}`)
	// The correction in force scales each prompt (0.25 to 3): an image
	// charged 765 tokens and a tool of about 150 tokens show through it.
	if image < plain+765*0.25 {
		t.Errorf("reserved %.0f tokens with an image, %.0f without: want the image's 765 tokens reserved", image, plain)
	}
	if tools < plain+150*0.25 {
		t.Errorf("reserved %.0f tokens with a tool definition, %.0f without: want the tool's tokens reserved", tools, plain)
	}
}
