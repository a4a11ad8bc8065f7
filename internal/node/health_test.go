package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/node"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// groupDep is one deployment of model behind its own simulator, tier 0.
type groupDep struct {
	name string
	rpm  int
	// key is the one key its simulator takes ("": the configured one).
	key string
}

// group is a running node whose model is served by a group of
// deployments, each simulator on its own loopback server.
type group struct {
	info    node.Info
	servers map[string]*httptest.Server
	sims    map[string]*sim.Server
	cl      *client.Client
	log     *systest.SyncBuffer
}

func startGroup(t *testing.T, deps []groupDep) *group {
	t.Helper()
	if testing.Short() {
		t.Skip("a node and a run of jobs, about 9 s: the full tier runs it, not -short")
	}
	g := &group{servers: map[string]*httptest.Server{}, sims: map[string]*sim.Server{}, log: &systest.SyncBuffer{}}
	var yaml strings.Builder
	yaml.WriteString("providers:\n")
	for _, d := range deps {
		key := d.key
		if key == "" {
			key = env["SIM_KEY"]
		}
		s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: d.rpm, TPM: 10_000_000}}, APIKeys: []string{key},
			TTFT: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(s)
		t.Cleanup(ts.Close)
		g.servers[d.name], g.sims[d.name] = ts, s
		fmt.Fprintf(&yaml, "  - {name: %s, base_url: %s/v1, api_key_env: SIM_KEY, models: [{name: %s, rpm: %d, tpm: 10000000}]}\n",
			d.name, ts.URL, model, d.rpm)
	}
	yaml.WriteString("tenants:\n  - {name: acme, api_key_env: ACME_KEY}\n")
	cfg, err := config.Parse([]byte(yaml.String()))
	if err != nil {
		t.Fatal(err)
	}
	g.info, _ = runNode(t, node.Options{Config: cfg, Data: t.TempDir(), Log: slog.New(slog.NewJSONHandler(g.log, nil))})
	if g.cl, err = client.New(connect(t, g.info.NATSURL, client.TenantUser("acme", env["ACME_KEY"]))); err != nil {
		t.Fatal(err)
	}
	return g
}

// run submits n jobs at once, calls during (if not nil) once they are
// submitted, and returns how many each deployment served; every job must
// succeed.
func (g *group) run(t *testing.T, n int, during func()) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second) // a loaded machine under -race
	defer cancel()
	var mu sync.Mutex
	served := map[string]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := g.cl.Do(ctx, &job.Job{Tenant: "acme", Request: chat(3)})
			if err != nil || res.Status != job.StatusSucceeded {
				t.Errorf("job %d: %+v, %v; want succeeded", i, res, err)
				return
			}
			mu.Lock()
			served[res.Provider]++
			mu.Unlock()
		})
	}
	if during != nil {
		during()
	}
	wg.Wait()
	return served
}

// A deployment whose simulator stops mid-run: the jobs it was given and
// would have been given finish on the others; none is lost or
// dead-lettered.
func TestDeploymentStoppedMidRun(t *testing.T) {
	t.Parallel()
	g := startGroup(t, []groupDep{{name: "a", rpm: 600}, {name: "b", rpm: 600}, {name: "c", rpm: 600}})
	served := g.run(t, 60, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if !natstest.Poll(ctx, func() bool { return g.sims["b"].Stats().Models[model].Admitted >= 3 }) {
			t.Error("b was given no job")
			return
		}
		g.servers["b"].Close()
	})
	t.Logf("served: %v", served)
	if served["a"]+served["c"] == 0 || served["a"]+served["b"]+served["c"] != 60 {
		t.Errorf("served %v; want all 60, the others taking b's", served)
	}
	if got := counter(t, g.info.Registry, "sluice_dead_letters_total", nil); got != 0 {
		t.Errorf("%v dead letters, want 0", got)
	}
	if got := counter(t, g.info.Registry, "sluice_deployment_state_changes_total", map[string]string{"provider": "b", "state": "down"}); got < 1 {
		t.Errorf("b taken down %v times, want at least once", got)
	}
}

// A deployment whose key is refused (401) is skipped: no job fails, and
// the change is logged once, without the key, and counted.
func TestDeploymentWrongKeySkipped(t *testing.T) {
	t.Parallel()
	g := startGroup(t, []groupDep{{name: "good", rpm: 600}, {name: "bad", rpm: 600, key: "another-key"}})
	served := g.run(t, 24, nil)
	if served["good"] != 24 {
		t.Errorf("served %v; want all 24 by good", served)
	}
	if got := g.sims["bad"].Stats().Requests[401]; got == 0 {
		t.Error("bad refused no call: the test proves nothing")
	}
	if got := counter(t, g.info.Registry, "sluice_dead_letters_total", nil); got != 0 {
		t.Errorf("%v dead letters, want 0", got)
	}
	if got := counter(t, g.info.Registry, "sluice_deployment_state_changes_total", map[string]string{"provider": "bad", "state": "down"}); got != 1 {
		t.Errorf("bad taken down %v times, want once", got)
	}
	logs := g.log.String()
	if n := strings.Count(logs, `"msg":"deployment down: no jobs are placed on it until a probe succeeds","provider":"bad"`); n != 1 {
		t.Errorf("%d lines say bad went down, want 1:\n%s", n, logs)
	}
	if !strings.Contains(logs, `"reason":"auth_401"`) || strings.Contains(logs, env["SIM_KEY"]) || strings.Contains(logs, "another-key") {
		t.Errorf("the log names no auth_401, or a key:\n%s", logs)
	}
}
