package systest

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestBodiesReadTwoWaysNeverReachTheProvider: a body Sluice would budget
// one way and a provider run another (members named alike in two cases,
// the Responses API's internal member from a producer, store) is refused
// with a 400 over HTTP and a failed result over NATS, and the provider is
// called only for the one good job after them.
func TestBodiesReadTwoWaysNeverReachTheProvider(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 1000, TPM: 1000000}}, APIKeys: []string{"sim-secret"}})
	n := Start(t, SimConfig(simURL, "gpt-4o-mini", 1000, 1000000, ""), Env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	hi := `"messages":[{"role":"user","content":"hi"}]`
	prompt := strings.Repeat("lorem ipsum ", 2000)
	native := `"sluice_responses":{"input":[{"role":"user","content":"` + prompt + `"}],"tools":[{"type":"web_search"}]}`
	for _, tc := range []struct{ name, path, body, want string }{
		{"max_tokens", "/v1/chat/completions", `{"model":"gpt-4o-mini",` + hi + `,"max_tokens":100000,"MAX_TOKENS":1}`, `duplicate member "max_tokens"`},
		{"n", "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":16,` + hi + `,"n":100,"N":1}`, `duplicate member "n"`},
		{"messages", "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"` + prompt + `"}],"MESSAGES":[{"role":"user","content":"hi"}]}`, `duplicate member "messages"`},
		{"model", "/v1/chat/completions", `{"model":"gpt-4o-mini","MODEL":"gpt-4o",` + hi + `}`, `duplicate member "model"`},
		{"store", "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":16,` + hi + `,"store":true}`, "allow_fields"},
		{"messages API", "/v1/messages", `{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"hi","CONTENT":"x"}]}`, `duplicate member "content"`},
		{"responses API", "/v1/responses", `{"model":"gpt-4o-mini","input":"hi","max_output_tokens":100000,"max_output_tokens":1}`, `duplicate member "max_output_tokens"`},
		{"jobs API", "/v1/jobs", `{"request":{"model":"gpt-4o-mini",` + hi + `,"max_tokens":100000,"MAX_TOKENS":1}}`, `duplicate member "max_tokens"`},
		{"smuggled native member", "/v1/jobs", `{"endpoint":"responses","request":{"model":"gpt-4o-mini","max_tokens":16,` + hi + `,` + native + `}}`, "set by Sluice only"},
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.HTTP+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer acme-key")
		req.Header.Set("Anthropic-Version", "2023-06-01")
		req.Header.Set("X-Sluice-Wait-Timeout", "2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var e struct {
			Error struct{ Message string }
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s: POST %s: got %d %q, want 400 saying %s", tc.name, tc.path, resp.StatusCode, e.Error.Message, tc.want)
		}
	}

	nc, cl := n.Connect(t)
	for _, tc := range []struct{ name, data, want string }{
		{"max_tokens", `{"request":{"model":"gpt-4o-mini",` + hi + `,"max_tokens":100000,"MAX_TOKENS":1}}`, `duplicate member "max_tokens"`},
		{"smuggled native member", `{"endpoint":"responses","request":{"model":"gpt-4o-mini","max_tokens":16,` + hi + `,` + native + `}}`, "set by Sluice only"},
	} {
		id := job.NewID()
		sub, err := nc.SubscribeSync(job.ResultSubject("acme", id))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.Request(job.IntakeSubject("acme"), []byte(`{"id":"`+id+`",`+tc.data[1:]), 5*time.Second); err != nil {
			t.Fatalf("%s: publish: %v", tc.name, err)
		}
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%s over NATS: no result: %v", tc.name, err)
		}
		var r job.Result
		_ = json.Unmarshal(m.Data, &r)
		if r.Status != job.StatusFailed || r.Error == nil || !strings.Contains(r.Error.Message, tc.want) {
			t.Errorf("%s over NATS: got %+v, want failed saying %s", tc.name, r, tc.want)
		}
		_ = sub.Unsubscribe()
	}

	res, err := cl.Do(ctx, &job.Job{Tenant: "acme", Request: ChatBody("gpt-4o-mini", 5, 16)})
	if err != nil || res.Status != job.StatusSucceeded {
		t.Fatalf("good job after the refused ones: %v %+v", err, res)
	}
	if st := simSrv.Stats(); st.Completed != 1 || st.Models["gpt-4o-mini"].Admitted != 1 {
		t.Errorf("provider saw %d admitted calls, %d completed; want exactly the 1 good one", st.Models["gpt-4o-mini"].Admitted, st.Completed)
	}
}
