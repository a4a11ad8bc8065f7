package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestQueueVisibilityAndBackpressure: jobs waiting for an RPM budget show in
// `sluice queue` and say why they wait; under pressure batch is shed with a
// Retry-After, and a deadline the queue makes impossible is refused at once.
func TestQueueVisibilityAndBackpressure(t *testing.T) {
	t.Parallel()
	_, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 2, TPM: 1000000}}, APIKeys: []string{"sim-secret"}})
	cfgYAML := systest.SimConfig(simURL, "gpt-4o-mini", 2, 1000000, "admission:\n  shed: {batch: 0.00001, standard: 1}\n")
	n := systest.Start(t, cfgYAML, systest.Env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ids []string
	for range 10 {
		id, err := cl.Submit(ctx, &job.Job{Tenant: "acme", Request: systest.ChatBody("gpt-4o-mini", 5, 16)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// A job behind the first (which goes first is the fair queue's choice)
	// waits for the model's RPM budget, and says so once admission has
	// looked at it (how soon is the machine's business).
	natstest.Eventually(t, 30*time.Second, func() error {
		var seen []string
		for _, id := range ids {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.HTTP+"/v1/jobs/"+id, nil)
			req.Header.Set("Authorization", "Bearer acme-key")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			var got struct {
				Status  string
				Waiting struct{ Reason string }
			}
			_ = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			seen = append(seen, got.Status+"/"+got.Waiting.Reason)
			if got.Status == "queued" && (got.Waiting.Reason == "rpm" || got.Waiting.Reason == "paused_provider") {
				return nil
			}
		}
		return fmt.Errorf("no job queued waiting for rpm among %v", seen)
	})

	// sluice queue shows the backlog.
	dir := t.TempDir()
	cfgPath := dir + "/sluice.yaml"
	if err := writeFile(cfgPath, cfgYAML); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	// The backlog, and the token correction the first answer taught the
	// fleet, reach `sluice queue` once admission and the result service
	// have written them: how soon is the machine's business.
	natstest.Eventually(t, 45*time.Second, func() error {
		out.Reset()
		if err := run(ctx, []string{"queue", "--nats-url", n.NATS, "--data", n.Data, "--config", cfgPath}, func(string) string { return "" }, &out, &errOut); err != nil {
			t.Fatalf("sluice queue: %v (%s)", err, errOut.String())
		}
		s := out.String()
		if !backlogRow(s) {
			return fmt.Errorf("sluice queue printed:\n%s\n(stderr %s) want a standard/acme row waiting for rpm, burst or a paused provider, with an estimated wait", s, errOut.String())
		}
		if !strings.Contains(s, "TOKEN CORRECTION") || !strings.Contains(s, "sim.gpt-4o-mini  (all)") {
			return fmt.Errorf("sluice queue printed:\n%s\nwant the token correction of sim.gpt-4o-mini", s)
		}
		return nil
	})
	// --json --limits gives the correction as rows.
	out.Reset()
	if err := run(ctx, []string{"queue", "--nats-url", n.NATS, "--data", n.Data, "--json", "--limits"}, func(string) string { return "" }, &out, &errOut); err != nil {
		t.Fatalf("sluice queue --json --limits: %v (%s)", err, errOut.String())
	}
	var rows []struct {
		Model, Dimension, Class string
		Correction              float64
		Samples                 int
	}
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("sluice queue --json --limits: %v\n%s", err, out.String())
	}
	found := false
	for _, r := range rows {
		if r.Dimension == "prompt_correction" && r.Model == "sim.gpt-4o-mini" && r.Class == "" {
			found = r.Samples >= 1 && r.Correction >= 0.25 && r.Correction <= 3
		}
	}
	if !found {
		t.Errorf("sluice queue --json --limits: no learned prompt_correction row for sim.gpt-4o-mini in\n%s", out.String())
	}

	post := func(priority, deadline string) (int, string, string) {
		body := fmt.Sprintf(`{"priority":%q,%s"request":{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}}`, priority, deadline)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.HTTP+"/v1/jobs", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer acme-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e struct{ Error struct{ Code string } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After")
	}
	// Batch is shed while the queue is past its shed level, once ingest has
	// read the queue's depth (it does at most once a second).
	natstest.Eventually(t, 30*time.Second, func() error {
		if status, code, ra := post("batch", ""); status != 429 || code != "shed" || ra == "" || ra == "0" {
			return fmt.Errorf("batch under pressure: %d %q Retry-After %q; want 429 shed with a Retry-After", status, code, ra)
		}
		return nil
	})
	// A deadline the queue ahead makes impossible is refused now.
	dl := time.Now().Add(10 * time.Second).UTC().Format(time.RFC3339)
	if status, code, _ := post("interactive", `"deadline":"`+dl+`",`); status != 429 || code != "deadline_unmeetable" {
		t.Errorf("unmeetable deadline: %d %q; want 429 deadline_unmeetable", status, code)
	}
	// Interactive work without a deadline is still taken.
	if status, code, _ := post("interactive", ""); status != 202 {
		t.Errorf("interactive under pressure: %d %q; want 202", status, code)
	}
}

// backlogRow reports whether `sluice queue` printed a standard/acme row
// waiting for the model's rpm (or its per-second quantum, burst) or a
// paused provider, with an estimated wait.
func backlogRow(out string) bool {
	for _, line := range strings.Split(out, "\n") {
		// PRIORITY TENANT DEPTH OLDEST MODEL EST.WAIT WAITING-FOR TAKEN/WINDOW
		f := strings.Fields(line)
		if len(f) == 8 && f[0] == "standard" && f[1] == "acme" && f[5] != "0s" && (f[6] == "rpm" || f[6] == "burst" || f[6] == "paused_provider") && strings.HasSuffix(f[7], "/10000") {
			return true
		}
	}
	return false
}
