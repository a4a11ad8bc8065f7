package systest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// scrape reads a /metrics page into name{labels} -> value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad metrics line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// sum adds the series of a metric whose labels match every given label.
func sum(m map[string]float64, name string, labels ...string) (float64, int) {
	var total float64
	n := 0
	for k, v := range m {
		base, lbl, _ := strings.Cut(k, "{")
		if base != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(lbl, l) {
				ok = false
			}
		}
		if ok {
			total += v
			n++
		}
	}
	return total, n
}

var labelRE = regexp.MustCompile(`(\w+)="([^"]*)"`)

// TestMetricsAfterARun runs jobs against a provider whose real limit is
// below the configured one, so some calls get 429, then checks that every
// metric operators rely on is exported with sensible values.
func TestMetricsAfterARun(t *testing.T) {
	t.Parallel()
	simSrv, simURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 5, TPM: 1000000}}, APIKeys: []string{"sim-secret"}})
	_, backupURL := StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "backup-model"}}})
	n := Start(t, fmt.Sprintf(`
server: {open: true}
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models: [{name: gpt-4o-mini, rpm: 600, tpm: 1000000}]
  - name: backup
    base_url: %s/v1
    models: [{name: backup-model}]
tenants:
  - {name: acme}
  - {name: globex}
retry:
  interactive: {max_attempts: 2, max_elapsed: 3s, base_delay: 50ms, max_delay: 200ms}
routes:
  - primary: {provider: sim, model: gpt-4o-mini}
    fallbacks: [{provider: backup, model: backup-model, when: [provider_5xx]}]
`, simURL, backupURL), Env)
	_, cl := n.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	statuses := make(chan job.Status, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(5 * time.Second)
			res, err := cl.Do(ctx, &job.Job{Tenant: []string{"acme", "globex"}[i%2], Priority: job.Interactive, Deadline: &deadline, Request: ChatBody("gpt-4o-mini", 10+i, 32)})
			if err != nil {
				t.Errorf("job %d: %v", i, err)
				DumpStreams(t, n)
				return
			}
			statuses <- res.Status
		}()
	}
	wg.Wait()
	close(statuses)
	count := map[job.Status]int{}
	for s := range statuses {
		count[s]++
	}
	if count[job.StatusSucceeded] < 1 || count[job.StatusSucceeded] > 5 {
		t.Errorf("results %v, want between 1 and 5 (the provider's real RPM) succeeded", count)
	}
	t.Logf("results %v", count)
	// Every job has ended once no stream holds one; queue depth is sampled
	// every 2 s.
	Quiet(t, n, 30*time.Second)
	m := scrape(t, n.MetricsURL()+"/metrics")
	natstest.Eventually(t, 10*time.Second, func() error {
		m = scrape(t, n.MetricsURL()+"/metrics")
		if _, k := sum(m, "llm_queue_depth", `priority="interactive"`); k == 0 {
			return errors.New("llm_queue_depth not sampled yet")
		}
		return nil
	})
	must := func(name string, labels ...string) float64 {
		v, k := sum(m, name, labels...)
		if k == 0 {
			t.Errorf("metric %s%v is missing", name, labels)
		}
		return v
	}
	ok200 := must("llm_requests_total", `status="200"`)
	got429 := must("llm_requests_total", `status="429"`)
	hits := must("llm_rate_limit_hits_total", `limit_type="requests"`)
	reserved := must("llm_tokens_reserved_total", `model="gpt-4o-mini"`)
	used := must("llm_tokens_used_total", `model="gpt-4o-mini"`)
	requeues := must("sluice_rate_limit_requeues_total", `outcome="requeued"`)
	refusals := must("sluice_rate_limit_refusals_total")
	cuts := must("sluice_limit_cuts_total")
	must("sluice_limit_effective", `dimension="requests_per_second"`)
	must("sluice_send_lateness_seconds_count")
	must("llm_queue_depth", `priority="interactive"`)
	waits := must("llm_queue_wait_seconds_count", `priority="interactive"`)
	must("llm_queue_wait_seconds_bucket")
	must("llm_fallbacks_total", `from_provider="sim"`, `to_provider="backup"`, `reason="provider_5xx"`)
	must("llm_duplicate_suppressed_total", `task_type="default"`)
	in := must("sluice_tenant_tokens_total", `kind="input"`)
	out := must("sluice_tenant_tokens_total", `kind="output"`)
	must("sluice_tenant_tokens_total", `tenant="acme"`)
	must("sluice_tenant_tokens_total", `kind="cached"`)
	reqs := must("sluice_tenant_requests_total")
	must("sluice_model_limit", `limit="tpm"`)

	st := simSrv.Stats()
	if ok200 != float64(count[job.StatusSucceeded]) || got429 != float64(st.Requests[429]) || got429 == 0 {
		t.Errorf("llm_requests_total: %v x 200, %v x 429; the provider answered %v", ok200, got429, st.Requests)
	}
	if hits != got429 {
		t.Errorf("llm_rate_limit_hits_total %v, want every 429 (%v) counted", hits, got429)
	}
	// A 429 on an admitted job is Sluice's misjudgement: it goes back to
	// admission without spending an attempt (not a retry), and the limits
	// learn from it.
	if requeues == 0 || requeues > got429 || refusals != got429 {
		t.Errorf("sluice_rate_limit_requeues_total %v, refusals %v; want between 1 and the 429s (%v), and every 429 classified", requeues, refusals, got429)
	}
	if cuts < 1 {
		t.Errorf("sluice_limit_cuts_total %v after %v 429s: the limits learned nothing", cuts, got429)
	}
	if used == 0 || reserved < used {
		t.Errorf("tokens reserved %v, used %v: want reserved >= used > 0", reserved, used)
	}
	if waits < 1 {
		t.Errorf("llm_queue_wait_seconds observed no job")
	}
	if in == 0 || out == 0 || reqs != ok200+got429 {
		t.Errorf("tenant usage: input %v output %v requests %v; want tokens counted and requests = provider calls (%v)", in, out, reqs, ok200+got429)
	}
	// Label values are bounded: no job ids.
	for k := range m {
		for _, l := range labelRE.FindAllStringSubmatch(k, -1) {
			if len(l[2]) == 36 && strings.Count(l[2], "-") == 4 {
				t.Errorf("series %s carries an id-like label value", k)
			}
		}
	}
}

// /metrics says which build runs: sluice_build_info at 1, labelled with the
// running binary's Go version (and its version, never empty).
func TestBuildInfoMetric(t *testing.T) {
	t.Parallel()
	n := Start(t, "server: {open: true}\ntenants: [{name: acme}]\n", nil)
	m := scrape(t, n.MetricsURL()+"/metrics")
	v, k := sum(m, "sluice_build_info", `go_version="`+runtime.Version()+`"`)
	if k != 1 || v != 1 {
		t.Errorf("sluice_build_info{go_version=%q}: %d series summing to %v, want one at 1", runtime.Version(), k, v)
	}
	if _, k := sum(m, "sluice_build_info", `version=""`); k != 0 {
		t.Error("sluice_build_info has an empty version label")
	}
}
