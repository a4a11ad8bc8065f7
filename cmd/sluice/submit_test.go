package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// TestSubmitStream: `sluice submit --stream` prints the answer's text as it
// comes (the same text as the unstreamed answer), then the job's id,
// status and usage on stderr; a stream that breaks is an error naming
// the job and why, after the text received.
func TestSubmitStream(t *testing.T) {
	t.Parallel()
	_, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 200000}}, APIKeys: []string{"sim-secret"},
		Faults: sim.Faults{RateStreamCut: 1, StreamCutAfter: 2, MaxFaults: 1}})
	n := systest.Start(t, systest.SimConfig(simURL, "gpt-4o-mini", 600, 200000, ""), systest.Env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	submit := func(extra ...string) (string, string, error) {
		var out, errOut strings.Builder
		args := append([]string{"submit", "--nats-url", n.NATS, "--data", n.Data, "--tenant", "acme", "--prompt", "Tell me a story.", "--max-tokens", "24"}, extra...)
		err := run(ctx, args, func(string) string { return "" }, &out, &errOut)
		return out.String(), errOut.String(), err
	}
	// The first call is cut after two tokens.
	out, errOut, err := submit("--stream")
	if err == nil || !strings.Contains(err.Error(), string(job.StatusInterrupted)) {
		t.Fatalf("cut stream: err %v (stderr %q), want the job interrupted", err, errOut)
	}
	if words := strings.Fields(out); len(words) != 2 {
		t.Errorf("cut stream printed %q, want the 2 words sent", out)
	}
	out, errOut, err = submit("--stream")
	if err != nil {
		t.Fatalf("stream: %v (stderr %q)", err, errOut)
	}
	if !regexp.MustCompile(`^job \S+ succeeded \(\d+ prompt \+ [1-9]\d* completion tokens\)`).MatchString(errOut) {
		t.Errorf("stderr %q, want the job's id and status", errOut)
	}
	plain, _, err := submit()
	if err != nil {
		t.Fatal(err)
	}
	var res job.Result
	if err := json.Unmarshal([]byte(plain), &res); err != nil {
		t.Fatalf("unstreamed output %q: %v", plain, err)
	}
	if want := systest.ResponseText(t, &res); strings.TrimSpace(out) != want {
		t.Errorf("streamed text %q, unstreamed %q: want the same answer", strings.TrimSpace(out), want)
	}
	if _, _, err := submit("--stream", "--wait", "0"); err == nil {
		t.Error("--stream with --wait 0 was accepted")
	}
}

// sluice submit with only --config finds the embedded server at the
// file's server.nats_listen, and the tenant when the file has one.
func TestSubmitReadsNATSListen(t *testing.T) {
	t.Parallel()
	_, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 200000}}, APIKeys: []string{"sim-secret"}})
	n := systest.Start(t, systest.SimConfig(simURL, "gpt-4o-mini", 600, 200000, ""), systest.Env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	listen := strings.TrimPrefix(strings.TrimPrefix(n.NATS, "nats://"), "tls://")
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	yaml := fmt.Sprintf("server: {nats_listen: %q}\nproviders:\n  - {name: sim, base_url: %q, models: [{name: gpt-4o-mini}]}\ntenants:\n  - {name: acme}\n", listen, simURL+"/v1")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	err := run(ctx, []string{"submit", "--config", path, "--data", n.Data, "--prompt", "hi", "--max-tokens", "8"}, func(string) string { return "" }, &out, &errOut)
	var res job.Result
	if err != nil || json.Unmarshal([]byte(out.String()), &res) != nil || res.Status != job.StatusSucceeded || res.Tenant != "acme" {
		t.Errorf("submit with nats_listen and one tenant: %v, %q (stderr %q), want acme's job succeeded", err, out.String(), errOut.String())
	}
}
