package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/internal/natsauth"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// sluiceBinary builds the sluice binary once per test run (with -race
// when SLUICE_TEST_RACE_BINARY is set).
func sluiceBinary(t testing.TB) string {
	t.Helper()
	systest.SkipShort(t)
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "sluice")
		args := []string{"build", "-o", binPath}
		if os.Getenv("SLUICE_TEST_RACE_BINARY") != "" {
			// The children under the race detector too (the cluster
			// benchmarks' -race run; CI does not, for its time).
			args = append(args, "-race")
		}
		cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), append(args, ".")...)
		cmd.Stderr = os.Stderr
		buildErr = cmd.Run()
	})
	if buildErr != nil {
		t.Fatalf("build sluice: %v", buildErr)
	}
	return binPath
}

// child is a `sluice up` OS process.
type child struct {
	cmd *exec.Cmd
	systest.Node
	log string // its stderr
}

func startChild(t testing.TB, bin string, args []string, env map[string]string) *child {
	t.Helper()
	return spawnChild(t, bin, args, env)()
}

// spawnChild starts a `sluice up` process and returns a function that
// waits until it is ready (so that cluster nodes, which wait for each
// other, start together).
func spawnChild(t testing.TB, bin string, args []string, env map[string]string) func() *child {
	t.Helper()
	return spawnChildIn(t, nil, bin, args, env)
}

// spawnChildIn is spawnChild run through prefix (a network namespace's
// `ip netns exec NS`; nil: directly).
func spawnChildIn(t testing.TB, prefix []string, bin string, args []string, env map[string]string) func() *child {
	t.Helper()
	argv := append(append(append([]string(nil), prefix...), bin, "up"), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.CreateTemp(t.TempDir(), "sluice-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	t.Cleanup(func() {
		if dir := os.Getenv("SLUICE_TEST_LOGS"); dir != "" {
			// Every child's whole log, kept to study later.
			data, _ := os.ReadFile(logf.Name())
			_ = os.WriteFile(filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+filepath.Base(logf.Name())), data, 0o600)
		}
		if t.Failed() {
			data, _ := os.ReadFile(logf.Name())
			if len(data) > 20000 {
				data = data[len(data)-20000:]
			}
			t.Logf("%s:\n%s", logf.Name(), data)
		}
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return func() *child {
		t.Helper()
		n := waitUp(t, out)
		if i := slices.Index(args, "--data"); i >= 0 && i+1 < len(args) && !slices.Contains(args, "--nats-url") {
			// Its embedded server's operator identity is in its data directory.
			n.Data = args[i+1]
			opts, _, err := natsauth.Conn{Config: &config.Config{}, DataDir: n.Data, Set: natsauth.Operator}.Options()
			if err != nil {
				t.Fatal(err)
			}
			n.NATSOptions = opts
		}
		systest.WaitReady(t, n.HTTP)
		return &child{cmd: cmd, Node: n, log: logf.Name()}
	}
}

// TestCrashRecovery kills a `sluice up` process with SIGKILL while jobs are
// in flight, restarts it on the same data directory, and checks that every
// job accepted before the kill ends with exactly one result and no prompt
// is completed twice by the provider. Against a provider that ignores
// Idempotency-Key (as OpenAI and Anthropic document their completions), a
// call that was in flight at the kill is not sent again: its job ends
// outcome_unknown, in the DLQ. Against one configured as honouring it, the
// call is sent again with the same key and answered from the provider's
// record: every job succeeds.
func TestCrashRecovery(t *testing.T) {
	t.Parallel()
	for _, honours := range []bool{false, true} {
		name := "ignores-key"
		if honours {
			name = "honours-key"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			crashRecovery(t, honours)
		})
	}
}

func crashRecovery(t *testing.T, honours bool) {
	bin := sluiceBinary(t)
	const model, jobs = "gpt-4o-mini", 300
	// Slow enough that calls are in flight at the kill.
	simSrv, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 100000, TPM: 10000000}},
		TTFT: 300 * time.Millisecond, PerToken: time.Millisecond, APIKeys: []string{"sim-secret"}, IgnoreIdempotencyKey: !honours})
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	// A short call timeout bounds how long a delivery that finds a call
	// marked sent waits for its executor before it calls the outcome
	// unknown.
	yaml := strings.Replace(systest.SimConfig(simURL, model, 100000, 10000000, ""), "    api_key_env: SIM_KEY\n",
		fmt.Sprintf("    api_key_env: SIM_KEY\n    timeout: 5s\n    honours_idempotency_key: %v\n", honours), 1)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", cfg, "--data", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-level", "debug"}

	first := startChild(t, bin, args, systest.Env)
	_, cl := first.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	ids := make([]string, 0, jobs)
	for i := range jobs {
		id, err := cl.Submit(ctx, &job.Job{Tenant: []string{"acme", "globex", "initech"}[i%3], Request: systest.ChatBody(model, 10+i%50, 100)})
		if err != nil {
			t.Fatalf("submit #%d: %v", i, err)
		}
		ids = append(ids, id)
	}
	// Kill it mid-run: some calls done, others in flight or queued.
	if !natstest.Poll(ctx, func() bool { return simSrv.Stats().Completed >= jobs/4 }) {
		t.Fatal("no progress before the kill")
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.cmd.Wait()
	atKill := simSrv.Stats().Completed
	t.Logf("killed after %d of %d provider completions", atKill, jobs)
	if atKill >= jobs {
		t.Fatal("every job finished before the kill; the test proves nothing")
	}

	second := startChild(t, bin, args, systest.Env)
	nc2, cl2 := second.Connect(t)
	js2, err := jetstream.New(nc2)
	if err != nil {
		t.Fatal(err)
	}
	statuses := map[string]int{}
	var unknown []string
	for i, id := range ids {
		var r *job.Result
		if !natstest.Poll(ctx, func() bool {
			var err error
			r, err = cl2.Lookup(ctx, []string{"acme", "globex", "initech"}[i%3], id)
			return err == nil && r != nil
		}) {
			out, _ := exec.Command("curl", "-s", second.MetricsURL()+"/metrics").Output()
			t.Logf("metrics: %s", grepLines(string(out), "sluice_", "llm_"))
			systest.DumpStreams(t, second.Node)
			out, _ = exec.Command("curl", "-s", second.HTTP+"/v1/jobs/"+id, "-H", "Authorization: Bearer acme-key").Output()
			t.Logf("job: %s", out)
			t.Fatalf("job %s has no result after restart", id)
		}
		switch {
		case r.Status == job.StatusSucceeded:
			statuses["succeeded"]++
		case !honours && r.Status == job.StatusFailed && r.Error != nil && r.Error.Code == "outcome_unknown":
			statuses["outcome_unknown"]++
			unknown = append(unknown, id)
		default:
			t.Errorf("job %s ended %s (%+v)", id, r.Status, r.Error)
		}
	}
	st := simSrv.Stats()
	t.Logf("results %v; provider: %d completed, %d replayed from its idempotency ledger, %d duplicate completions",
		statuses, st.Completed, st.Replayed, st.DuplicateCompletions)
	if st.DuplicateCompletions != 0 {
		t.Errorf("provider completed %d operations twice", st.DuplicateCompletions)
	}
	isUnknown := map[string]bool{}
	for _, id := range unknown {
		isUnknown[id] = true
		// The operator sees it, with the attempt that was lost.
		e, err := dlq.Get(ctx, js2, "", id)
		if err != nil || e.Reason != dlq.ReasonOutcomeUnknown || len(e.Job.Attempts) == 0 {
			t.Errorf("job %s ended outcome_unknown; its dead letter is %+v (%v)", id, e, err)
		}
	}
	for _, id := range ids {
		n := st.JobCompletions[id]
		if n > 1 || (n != 1 && !isUnknown[id]) {
			t.Errorf("job %s completed %d times at the provider (outcome unknown: %v)", id, n, isUnknown[id])
		}
	}
}

func grepLines(s string, prefixes ...string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				b.WriteString(l + "\n")
			}
		}
	}
	return b.String()
}

// TestStreamExecutorLost: the executor streaming a job is killed after the
// first tokens reached the caller. The job is not called again (that would
// pay twice and follow the relayed text with a second answer): another
// executor picks up the redelivery and ends it interrupted from what
// STREAMS holds, and the caller's stream ends with that error.
func TestStreamExecutorLost(t *testing.T) {
	t.Parallel()
	bin := sluiceBinary(t)
	const model = "gpt-4o-mini"
	simSrv, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 600, TPM: 200000}}, APIKeys: []string{"sim-secret"},
		TTFT: 50 * time.Millisecond, PerToken: 200 * time.Millisecond})
	ns := natstest.Server(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(systest.SimConfig(simURL, model, 600, 200000, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	args := func(services string) []string {
		return []string{"--config", cfg, "--nats-url", ns.ClientURL(), "--http", "127.0.0.1:0", "--services", services}
	}
	front := startChild(t, bin, args("ingest,admission,result"), systest.Env)
	victim := startChild(t, bin, args("executor"), systest.Env)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var resp *http.Response
	c := systest.SDK(front.Node)
	st := c.Chat.Completions.NewStreaming(ctx, systest.StreamParams("Keep talking.", 120), option.WithResponseInto(&resp))
	defer st.Close()
	var text strings.Builder
	chunks, killed := 0, false
	for st.Next() {
		for _, c := range st.Current().Choices {
			text.WriteString(c.Delta.Content)
			if c.Delta.Content != "" {
				chunks++
			}
		}
		if chunks >= 3 && !killed {
			killed = true
			_ = victim.cmd.Process.Signal(syscall.SIGKILL)
			_ = victim.cmd.Wait()
			startChild(t, bin, args("executor"), systest.Env)
		}
	}
	if !killed {
		t.Fatalf("the stream ended after %d chunks, before the kill (%v)", chunks, st.Err())
	}
	if err := st.Err(); err == nil || !strings.Contains(err.Error(), job.CodeStreamInterrupted) {
		t.Fatalf("the stream ended with %v, want %s", err, job.CodeStreamInterrupted)
	}
	got := text.String()
	if words := strings.Fields(got); len(words) < 3 || len(words) >= 30 {
		t.Errorf("caller got %d words (%q): want those relayed before the kill, not a second answer after them", len(words), got)
	}
	id := resp.Header.Get("X-Sluice-Job-Id")
	r := systest.JobResult(t, front.Node, id)
	if r.Status != job.StatusInterrupted || r.Error == nil || !strings.Contains(r.Error.Message, "executor") {
		t.Errorf("result %s (%+v), want interrupted because the executor was lost", r.Status, r.Error)
	}
	if rt := systest.ResponseText(t, r); !strings.HasPrefix(rt, got) && !strings.HasPrefix(got, rt) {
		t.Errorf("result text %q is not the text relayed %q", rt, got)
	}
	// A second call would come from the job's dispatch, still in DISPATCH
	// until the killed executor's ack wait ends and another takes it.
	systest.Quiet(t, front.Node, 90*time.Second)
	if s := simSrv.Stats(); s.Streamed != 1 || s.JobCompletions[id] > 1 {
		t.Errorf("simulator: %d streams, %d completions of the job; want exactly 1 provider call", s.Streamed, s.JobCompletions[id])
	}
}
