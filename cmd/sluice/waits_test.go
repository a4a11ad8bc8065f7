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

// waitsConfig: a fast provider (a model for the tenants' own budgets, one
// whose rpm two tenants share) and a slow one (every call takes 4 s: a
// model for the tenant's concurrency, one with max_concurrency 1), a
// tenant per gate.
const waitsConfig = `
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: gpt-4o-mini, rpm: 100000, tpm: 100000000, max_concurrency: 128}
      - {name: fair-model, rpm: 20, tpm: 100000000, max_concurrency: 128, adaptive: false}
  - name: slow
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: slow-model, rpm: 100000, tpm: 100000000, max_concurrency: 64}
      - {name: slow-one, rpm: 100000, tpm: 100000000, max_concurrency: 1}
tenants:
  - {name: trpm, api_key_env: TRPM_KEY, rpm: 1}
  - {name: trpd, api_key_env: TRPD_KEY, rpd: 1}
  - {name: tconc, api_key_env: TCONC_KEY, max_concurrency: 1}
  - {name: tmodel, api_key_env: TMODEL_KEY}
  - {name: fairone, api_key_env: FAIRONE_KEY}
  - {name: fairtwo, api_key_env: FAIRTWO_KEY}
`

// TestEveryWaitExplained: a job held by each gate says why in GET
// /v1/jobs/{id} (with an expected end where one can be computed) and in
// `sluice queue`, which reads the limits the fleet published (no
// --config): the tenant's rpm and rpd, the tenant's and the model's
// max_concurrency, and the fair share of a model two tenants wait for.
func TestEveryWaitExplained(t *testing.T) {
	t.Parallel()
	fast := []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 1000000, TPM: 1000000000}, {Name: "fair-model", RPM: 1000000, TPM: 1000000000}}
	_, fastURL := systest.StartSim(t, sim.Config{Models: fast, APIKeys: []string{"sim-secret"}})
	slow := []sim.ModelLimits{{Name: "slow-model", RPM: 1000000, TPM: 1000000000}, {Name: "slow-one", RPM: 1000000, TPM: 1000000000}}
	_, slowURL := systest.StartSim(t, sim.Config{Models: slow, APIKeys: []string{"sim-secret"}, TTFT: 4 * time.Second})
	env := map[string]string{"SIM_KEY": "sim-secret"}
	for _, ten := range []string{"trpm", "trpd", "tconc", "tmodel", "fairone", "fairtwo"} {
		env[strings.ToUpper(ten)+"_KEY"] = ten + "-key"
	}
	n := systest.Start(t, fmt.Sprintf(waitsConfig, fastURL, slowURL), env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	submit := func(tenant, model string, k int) []string {
		var ids []string
		for range k {
			id, err := cl.Submit(ctx, &job.Job{Tenant: tenant, Request: systest.ChatBody(model, 5, 16)})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	for _, tc := range []struct {
		name, tenant, model, reason string
		jobs                        int
		minEnd                      time.Duration // the expected end at least this far (0: none asked)
	}{
		{"tenant rpm", "trpm", "gpt-4o-mini", "tenant_rpm", 3, time.Second},
		{"tenant rpd", "trpd", "gpt-4o-mini", "tenant_rpd", 2, time.Hour},
		{"tenant max_concurrency", "tconc", "slow-model", "tenant_concurrency", 3, 0},
		{"model max_concurrency", "tmodel", "slow-one", "model_concurrency", 6, 0},
		{"fair share", "fairone", "fair-model", "fair_share", 8, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids := submit(tc.tenant, tc.model, tc.jobs)
			if tc.reason == "fair_share" {
				submit("fairtwo", tc.model, tc.jobs)
			}
			natstest.Eventually(t, 60*time.Second, func() error {
				return waitingFor(ctx, n.HTTP, tc.tenant+"-key", ids, tc.reason, tc.minEnd)
			})
			natstest.Eventually(t, 60*time.Second, func() error {
				var out, errOut bytes.Buffer
				if err := run(ctx, []string{"queue", "--nats-url", n.NATS, "--data", n.Data}, func(string) string { return "" }, &out, &errOut); err != nil {
					t.Fatalf("sluice queue: %v (%s)", err, errOut.String())
				}
				return queueRowWaiting(out.String(), tc.tenant, tc.model, tc.reason, tc.minEnd > 0)
			})
		})
	}
	// sluice jobs: trpd's second job waits a day; list it, cancel it.
	jobsCLI := func(args ...string) string {
		var out, errOut bytes.Buffer
		env := func(k string) string { return map[string]string{"SLUICE_URL": n.HTTP, "SLUICE_API_KEY": "trpd-key"}[k] }
		if err := run(ctx, append([]string{"jobs"}, args...), env, &out, &errOut); err != nil {
			t.Fatalf("sluice jobs %v: %v (%s)", args, err, errOut.String())
		}
		return out.String()
	}
	var waiting string
	for _, line := range strings.Split(jobsCLI("list", "--status", "queued"), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[1] == "queued" {
			waiting = f[0]
		}
	}
	if waiting == "" {
		t.Fatal("sluice jobs list --status queued: no queued job of trpd")
	}
	if out := jobsCLI("cancel", waiting); out != waiting+": cancelled\n" {
		t.Errorf("sluice jobs cancel: got %q, want %q", out, waiting+": cancelled\n")
	}
	// The cancel answers once the result is published; the list reads
	// the job's record, which the result service writes from it after
	// (seen empty once, in a loaded run).
	natstest.Eventually(t, 30*time.Second, func() error {
		if out := jobsCLI("list", "--status", "cancelled"); !strings.Contains(out, waiting+"  cancelled") {
			return fmt.Errorf("sluice jobs list --status cancelled: got\n%s\nwant %s cancelled", out, waiting)
		}
		return nil
	})
}

// waitingFor checks that one of ids (a tenant's, read with its key) is
// queued or dispatched and waits for reason, ending at least minEnd ahead.
func waitingFor(ctx context.Context, base, key string, ids []string, reason string, minEnd time.Duration) error {
	var seen []string
	for _, id := range ids {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/jobs/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		var got struct {
			Status  string
			Waiting *struct {
				Reason, Limit string
				Until         time.Time
			}
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || got.Waiting == nil {
			seen = append(seen, got.Status+"/-")
			continue
		}
		w := got.Waiting
		seen = append(seen, fmt.Sprintf("%s/%s(%s) until %s", got.Status, w.Reason, w.Limit, w.Until.Format(time.TimeOnly)))
		if w.Reason == reason && (minEnd == 0 || time.Until(w.Until) >= minEnd) {
			return nil
		}
	}
	return fmt.Errorf("no job waiting for %s (ending %v ahead at least) among %v", reason, minEnd, seen)
}

// queueRowWaiting checks `sluice queue` printed a row of tenant and model
// waiting for reason (and, with est, an estimated wait).
func queueRowWaiting(out, tenant, model, reason string, est bool) error {
	for _, line := range strings.Split(out, "\n") {
		// PRIORITY TENANT DEPTH OLDEST MODEL EST.WAIT WAITING-FOR TAKEN/WINDOW
		f := strings.Fields(line)
		if len(f) != 8 || f[1] != tenant || f[4] != model || !strings.HasPrefix(f[6], reason) {
			continue
		}
		if est && (f[5] == "-" || f[5] == "0s") {
			return fmt.Errorf("row without an estimated wait: %q in\n%s", line, out)
		}
		return nil
	}
	return fmt.Errorf("no row of %s/%s waiting for %s in\n%s", tenant, model, reason, out)
}
