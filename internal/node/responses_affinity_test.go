package node_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestResponsesAffinity: the turns of a conversation chained by
// previous_response_id go to the deployment that served the one before,
// though the group prefers another; a new conversation goes to the
// preferred one. A built-in tool is taken only where every deployment it
// may go to runs it.
func TestResponsesAffinity(t *testing.T) {
	t.Parallel()
	sims := map[string]*sim.Server{}
	var yaml strings.Builder
	yaml.WriteString("providers:\n")
	// resp-model: ptu and east, both native; mixed: ptu, native, and
	// plain, called on Chat Completions.
	for _, d := range []struct {
		name, responses string
		models          []string
		weight          int
	}{{"ptu", "native", []string{respModel, "mixed"}, 1}, {"east", "native", []string{respModel}, 5}, {"plain", "chat", []string{"mixed"}, 1}} {
		var limits []sim.ModelLimits
		var models []string
		for _, m := range d.models {
			limits = append(limits, sim.ModelLimits{Name: m, RPM: 100000, TPM: 10000000})
			models = append(models, fmt.Sprintf("{name: %s, weight: %d, rpm: 100000, tpm: 10000000}", m, d.weight))
		}
		s, url := systest.StartSim(t, sim.Config{Models: limits, APIKeys: []string{"sim-secret"}})
		sims[d.name] = s
		fmt.Fprintf(&yaml, "  - {name: %s, base_url: %s/v1, api_key_env: SIM_KEY, responses: %s, models: [%s]}\n", d.name, url, d.responses, strings.Join(models, ", "))
	}
	yaml.WriteString("tenants:\n  - {name: acme, api_key_env: ACME_KEY}\n")
	cfg, err := config.Parse([]byte(yaml.String()))
	if err != nil {
		t.Fatal(err)
	}
	info, _ := startNode(t, cfg, t.TempDir())
	sdk := openai.NewClient(option.WithBaseURL("http://"+info.HTTPAddr+"/v1"), option.WithAPIKey("acme-key"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
	defer cancel()
	turn := func(prev, say string, opts ...option.RequestOption) string {
		t.Helper()
		p := responses.ResponseNewParams{Model: respModel, MaxOutputTokens: openai.Int(16), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(say)}}
		if prev != "" {
			p.PreviousResponseID = openai.String(prev)
		}
		r, err := sdk.Responses.New(ctx, p, opts...)
		if err != nil {
			t.Fatalf("%q after %q: %v", say, prev, err)
		}
		return r.ID
	}
	calls := func() string {
		return fmt.Sprintf("ptu %d, east %d", len(sims["ptu"].Requests()), len(sims["east"].Requests()))
	}

	// The first turn pinned to ptu; the follow-ups, one at a time (each
	// finds both deployments idle), unpinned.
	prev := turn("", "Turn 0.", option.WithHeader("X-Sluice-Provider", "ptu"))
	for i := 1; i < 5; i++ {
		prev = turn(prev, fmt.Sprintf("Turn %d.", i))
	}
	if got := calls(); got != "ptu 5, east 0" {
		t.Fatalf("a conversation's five turns: %s calls, want all on ptu, which served the first", got)
	}
	turn("", "Another conversation.")
	if got := calls(); got != "ptu 5, east 1" {
		t.Fatalf("after a new conversation: %s calls, want its turn on east (preferred)", got)
	}

	// A built-in tool needs every deployment it may be placed on to be
	// native: refused for mixed, unless pinned to ptu.
	search := responses.ResponseNewParams{Model: "mixed", MaxOutputTokens: openai.Int(16), Tools: []responses.ToolUnionParam{webSearch},
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Search.")}}
	if _, err := sdk.Responses.New(ctx, search); !isStatus(err, http.StatusBadRequest) {
		t.Errorf("web_search on a group with a translated deployment: %v, want 400", err)
	}
	if _, err := sdk.Responses.New(ctx, search, option.WithHeader("X-Sluice-Provider", "ptu")); err != nil {
		t.Errorf("web_search pinned to a native deployment: %v", err)
	}
	if got := calls(); got != "ptu 6, east 1" || len(sims["plain"].Requests()) != 0 {
		t.Errorf("%s calls, plain %d: want the pinned search on ptu", got, len(sims["plain"].Requests()))
	}
}
