package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Job ids are unique within a tenant only: two tenants that choose the same
// id, over NATS and over HTTP, each get a job of their own, answered with
// their own result from a provider call of their own, and each tenant's
// GET /v1/jobs/{id} shows its own job. (Before, the second tenant's job was
// refused: "ids are global".)
func TestSameJobIDInTwoTenants(t *testing.T) {
	t.Parallel()
	cfg, s := testConfig(t)
	info, _ := startNode(t, cfg, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Each tenant's prompt has its own length, so its result (the prompt
	// tokens the provider counted) says whose call answered it.
	tenants := []struct {
		name, key string
		words     int
	}{{"acme", env["ACME_KEY"], 3}, {"globex", env["GLOBEX_KEY"], 40}}
	prompt := map[string]int{}

	// Over NATS, each on its own tenant connection.
	natsID := job.NewID()
	for _, tn := range tenants {
		cl, err := client.New(connect(t, info.NATSURL, client.TenantUser(tn.name, tn.key)))
		if err != nil {
			t.Fatal(err)
		}
		res, err := cl.Do(ctx, &job.Job{ID: natsID, Tenant: tn.name, Request: chat(tn.words)})
		if err != nil || res.Status != job.StatusSucceeded || res.JobID != natsID || res.Tenant != tn.name || res.Usage == nil {
			t.Fatalf("%s's job %s over NATS: %+v, %v; want its own, succeeded", tn.name, natsID, res, err)
		}
		prompt[tn.name] = res.Usage.PromptTokens
	}
	if prompt["acme"] >= prompt["globex"] {
		t.Fatalf("prompt tokens acme %d, globex %d: want acme's shorter prompt counted for acme", prompt["acme"], prompt["globex"])
	}

	// Over HTTP.
	base := "http://" + info.HTTPAddr
	do := func(method, path, key string, body []byte) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var out map[string]any
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, data)
		}
		return resp.StatusCode, out
	}
	httpID := job.NewID()
	for _, tn := range tenants {
		body, _ := json.Marshal(map[string]any{"id": httpID, "request": json.RawMessage(chat(tn.words))})
		code, out := do(http.MethodPost, "/v1/jobs", tn.key, body)
		if code != http.StatusAccepted || out["id"] != httpID || out["tenant"] != tn.name || out["joined"] != false {
			t.Fatalf("%s's POST /v1/jobs with id %s: %d %v; want 202, its own job", tn.name, httpID, code, out)
		}
	}
	for _, id := range []string{natsID, httpID} {
		for _, tn := range tenants {
			code, out := do(http.MethodGet, "/v1/jobs/"+id+"?wait=30s", tn.key, nil)
			res, _ := out["result"].(map[string]any)
			usage, _ := res["usage"].(map[string]any)
			if code != http.StatusOK || out["tenant"] != tn.name || out["status"] != string(job.StatusSucceeded) ||
				res["tenant"] != tn.name || usage["prompt_tokens"] != float64(prompt[tn.name]) {
				t.Errorf("%s's GET /v1/jobs/%s: %d %v; want its own result (%d prompt tokens)", tn.name, id, code, out, prompt[tn.name])
			}
		}
	}
	st := s.Stats()
	if st.Completed != 4 || st.Replayed != 0 {
		t.Errorf("provider: %d calls completed, %d replayed; want 4 calls (one per tenant and id), none replayed", st.Completed, st.Replayed)
	}
}
