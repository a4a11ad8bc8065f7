package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/node"
	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
	"github.com/sluice-dev/sluice/streams"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const model = "gpt-4o-mini"

var env = map[string]string{"SIM_KEY": "sim-secret", "ACME_KEY": "acme-key", "GLOBEX_KEY": "globex-key"}

func getenv(k string) string { return env[k] }

// testConfig is one simulated provider serving model and the tenants acme
// and globex; the simulator serves until the test ends.
func testConfig(t *testing.T) (*config.Config, *sim.Server) {
	t.Helper()
	s, url := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: model, RPM: 100000, TPM: 10000000}}, APIKeys: []string{"sim-secret"}})
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: %s, rpm: 100000, tpm: 10000000, max_concurrency: 64}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
  - {name: globex, api_key_env: GLOBEX_KEY}
`, url, model)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg, s
}

// startNode runs an all-in-one node with an HTTP listener on data until
// the test ends (or stop is called) and returns what it serves.
func startNode(t *testing.T, cfg *config.Config, data string) (node.Info, func()) {
	t.Helper()
	return runNode(t, node.Options{Config: cfg, HTTP: "127.0.0.1:0", Data: data})
}

// runNode runs a node with o, on a loopback NATS port and the test's
// environment, until the test ends (or stop is called), and returns what
// it serves once it is ready; the test fails if the node does not stop
// cleanly.
func runNode(t *testing.T, o node.Options) (node.Info, func()) {
	t.Helper()
	o.NATSListen, o.Getenv = "127.0.0.1:0", getenv
	ready := make(chan node.Info, 1)
	o.OnReady = func(i node.Info) { ready <- i }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- node.Run(ctx, o) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("node: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case info := <-ready:
		return info, stop
	case err := <-done:
		done <- err
		t.Fatalf("node did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("node not ready after 30s")
	}
	return node.Info{}, stop
}

// counter sums a counter's series in reg, of those with a label that
// want names only those where it has want's value (want nil: all).
func counter(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func connect(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func chat(words int) []byte {
	return []byte(fmt.Sprintf(`{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":%q}]}`, model, strings.Repeat("lorem ", words)))
}

// recorder keeps the subjects a subscription saw.
type recorder struct {
	mu   sync.Mutex
	seen map[string]string
}

func (r *recorder) record(m *nats.Msg) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen[m.Subject] = string(m.Data)
}

func (r *recorder) get(subject string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.seen[subject]
	return d, ok
}

// TestTenantRepliesStayInItsAccount is a hostile tenant, connected with
// its own credentials to a running node, aiming replies at subjects
// outside its own: a wait-hint request (answered by ingest) and an intake
// publish (acknowledged by JetStream itself), each with a reply subject of
// another tenant's results and streams, the DLQ, a bucket's keys and the
// fleet key. Nothing arrives on any of them (seen by the operator and by
// the other tenant, and read back from the buckets and streams), the
// tenant's own paths keep working, and the node starts again afterwards.
func TestTenantRepliesStayInItsAccount(t *testing.T) {
	t.Parallel()
	cfg, _ := testConfig(t)
	data := t.TempDir()
	info, stop := startNode(t, cfg, data)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	op := connect(t, info.NATSURL, info.NATSOptions...)
	ojs, err := jetstream.New(op)
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := ojs.KeyValue(ctx, streams.BucketFleet)
	if err != nil {
		t.Fatalf("bind the fleet bucket: %v", err)
	}
	keyBefore, err := fleet.Get(ctx, guard.KeyName)
	if err != nil {
		t.Fatalf("the fleet key: %v", err)
	}
	seenByOp := &recorder{seen: map[string]string{}}
	if _, err := op.Subscribe("sluice.>", seenByOp.record); err != nil {
		t.Fatal(err)
	}
	globex := connect(t, info.NATSURL, client.TenantUser("globex", env["GLOBEX_KEY"]))
	seenByGlobex := &recorder{seen: map[string]string{}}
	for _, s := range []string{job.ResultPrefix + "globex.>", job.StreamPrefix + "globex.>"} {
		if _, err := globex.Subscribe(s, seenByGlobex.record); err != nil {
			t.Fatal(err)
		}
	}
	_ = op.Flush()
	_ = globex.Flush()

	other := job.NewID()
	foreign := []string{
		job.ResultSubject("globex", other), job.StreamSubject("globex", other), job.StoreSubject("globex", other),
		job.DLQSubject("globex", other), job.CancelSubject("globex", other), job.QueueSubject(job.Standard, "globex"),
		mesh.CancelledSubjectPrefix + "globex." + other,
		"$KV." + streams.BucketBudgets + ".fleet.key", "$KV." + streams.BucketBudgets + ".probe",
		"$KV." + streams.BucketResults + "." + other, "$KV." + streams.BucketIdempotency + ".globex.probe",
		"$KV." + streams.BucketFleet + "." + guard.KeyName,
	}
	acme := connect(t, info.NATSURL, client.TenantUser("acme", env["ACME_KEY"]))
	// The node is ready before its services subscribe: wait until ingest
	// answers wait hints, so the attempts below reach it.
	natstest.Eventually(t, 20*time.Second, func() error {
		_, err := acme.Request(job.WaitSubject("acme"), nil, 500*time.Millisecond)
		return err
	})
	for i, reply := range foreign {
		body, _ := json.Marshal(&job.Job{Tenant: "acme", Request: chat(3)})
		if err := acme.PublishRequest(job.WaitSubject("acme"), reply, body); err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg(job.IntakeSubject("acme"))
		msg.Reply = reply
		msg.Data, _ = json.Marshal(&job.Job{ID: job.NewID(), Tenant: "acme", Request: chat(3 + i)})
		if err := acme.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}

	// The legitimate paths, which also come after every attempt above: a
	// wait hint, a job and a streamed job over the tenant's connection.
	// Ingest answers a few hints per tenant at once and drops the rest:
	// ask until the attempts above are through.
	body, _ := json.Marshal(&job.Job{Tenant: "acme", Request: chat(3)})
	var m *nats.Msg
	natstest.Eventually(t, 20*time.Second, func() (err error) {
		m, err = acme.Request(job.WaitSubject("acme"), body, time.Second)
		return err
	})
	var hint job.WaitHint
	if err := json.Unmarshal(m.Data, &hint); err != nil || hint.RetryAfterMS <= 0 {
		t.Errorf("wait hint %q (%v), want a positive retry_after_ms", m.Data, err)
	}
	cl, err := client.New(acme)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cl.Do(ctx, &job.Job{Tenant: "acme", Request: chat(4)})
	if err != nil || res.Status != job.StatusSucceeded {
		t.Fatalf("acme's job over NATS: %+v, %v; want succeeded", res, err)
	}
	chunks, text := 0, ""
	for ch, err := range cl.Stream(ctx, &job.Job{Tenant: "acme", Request: chat(5)}) {
		if err != nil {
			t.Fatalf("acme's stream: %v", err)
		}
		chunks++
		text += ch.Text()
	}
	if chunks == 0 || text == "" {
		t.Errorf("acme's stream: %d chunks, text %q; want some", chunks, text)
	}
	// Whatever the attempts published was routed before these answers;
	// a round trip on each watching connection delivers it.
	_ = op.Flush()
	_ = globex.Flush()

	for _, s := range foreign {
		if d, ok := seenByOp.get(s); ok {
			t.Errorf("a message reached %s: %q", s, d)
		}
	}
	seenByGlobex.mu.Lock()
	for s, d := range seenByGlobex.seen {
		t.Errorf("globex received %s: %q", s, d)
	}
	seenByGlobex.mu.Unlock()
	for bucket, keys := range map[string][]string{
		streams.BucketBudgets: {"probe"}, streams.BucketResults: {other}, streams.BucketIdempotency: {"globex.probe"},
	} {
		kv, err := ojs.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if e, err := kv.Get(ctx, k); !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Errorf("bucket %s key %s: %v, want not found (value %q)", bucket, k, err, entryValue(e))
			}
		}
	}
	budgets, err := ojs.KeyValue(ctx, streams.BucketBudgets)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := budgets.Get(ctx, "fleet.key"); err == nil && len(e.Value()) < 32 {
		t.Errorf("the budgets bucket's fleet.key was overwritten: %q", e.Value())
	}
	if keyAfter, err := fleet.Get(ctx, guard.KeyName); err != nil || string(keyAfter.Value()) != string(keyBefore.Value()) || keyAfter.Revision() != keyBefore.Revision() {
		t.Errorf("the fleet key changed (%v)", err)
	}
	for _, sc := range []struct{ stream, subject string }{
		{streams.DLQ, job.DLQSubject("globex", other)}, {streams.Results, job.StoreSubject("globex", other)},
		{streams.StreamChunks, job.StreamSubject("globex", other)},
	} {
		st, err := ojs.Stream(ctx, sc.stream)
		if err != nil {
			t.Fatal(err)
		}
		if msg, err := st.GetLastMsgForSubject(ctx, sc.subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("stream %s holds a message on %s: %v %v", sc.stream, sc.subject, err, msgData(msg))
		}
	}
	dlq, err := ojs.Stream(ctx, streams.DLQ)
	if err != nil {
		t.Fatal(err)
	}
	if n := dlq.CachedInfo().State.Msgs; n != 0 {
		t.Errorf("the DLQ holds %d messages, want 0", n)
	}

	// The node starts again on the same data, and still serves acme.
	op.Close()
	stop()
	info2, _ := startNode(t, cfg, data)
	acme2 := connect(t, info2.NATSURL, client.TenantUser("acme", env["ACME_KEY"]))
	cl2, err := client.New(acme2)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := cl2.Do(ctx, &job.Job{Tenant: "acme", Request: chat(4)}); err != nil || res.Status != job.StatusSucceeded {
		t.Errorf("acme's job after a restart: %+v, %v; want succeeded", res, err)
	}
}

func entryValue(e jetstream.KeyValueEntry) string {
	if e == nil {
		return ""
	}
	return string(e.Value())
}

func msgData(m *jetstream.RawStreamMsg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}
