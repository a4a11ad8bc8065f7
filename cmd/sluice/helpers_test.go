package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natsauth"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// startSim serves a provider simulator on a loopback port for the test.
func startSim(t testing.TB, cfg sim.Config) (*sim.Server, string) {
	t.Helper()
	s, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts.URL
}

// startSimOn is startSim listening on addr.
func startSimOn(t testing.TB, cfg sim.Config, addr string) (*sim.Server, string) {
	t.Helper()
	s, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s)
	ts.Listener.Close()
	ts.Listener = l
	ts.Start()
	t.Cleanup(ts.Close)
	return s, ts.URL
}

// upNode is a running `sluice up`, in-process (run) or a child process.
type upNode struct {
	HTTP    string // base URL
	NATS    string
	Metrics string // the metrics listener's address, if it has one
}

// metricsURL is the base URL of the node's metrics listener.
func (n upNode) metricsURL() string { return "http://" + n.Metrics }

// nodeData maps an embedded NATS URL to its node's data directory, where
// the operator's NATS identity is: natsClient and operatorOpts find it.
var nodeData sync.Map

// Data is the node's data directory.
func (n upNode) Data(t testing.TB) string {
	d, ok := nodeData.Load(n.NATS)
	if !ok {
		t.Fatalf("no data directory known for %s", n.NATS)
	}
	return d.(string)
}

// operatorOpts are the options that connect to a `sluice up`'s embedded
// NATS as the operator; none for a server the tests started themselves.
func operatorOpts(t testing.TB, url string) []nats.Option {
	t.Helper()
	data, ok := nodeData.Load(url)
	if !ok {
		return nil
	}
	opts, _, err := natsauth.Conn{Config: &config.Config{}, DataDir: data.(string), Set: natsauth.Operator}.Options()
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

var (
	upLine      = regexp.MustCompile(`sluice up: nats (\S+), http (\S+),`)
	metricsLine = regexp.MustCompile(`, metrics (\S+)$`)
)

// waitUp reads a `sluice up` stdout stream until its ready line.
func waitUp(t testing.TB, r io.Reader) upNode {
	t.Helper()
	found := make(chan upNode, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if m := upLine.FindStringSubmatch(sc.Text()); m != nil {
				n := upNode{NATS: m[1], HTTP: "http://" + m[2]}
				if mm := metricsLine.FindStringSubmatch(sc.Text()); mm != nil {
					n.Metrics = mm[1]
				}
				found <- n
				break
			}
		}
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case n := <-found:
		return n
	case <-time.After(150 * time.Second):
		// Generous: a cluster node is ready only once the replicated streams
		// exist, which takes a quorum under a loaded CI machine.
		t.Fatal("sluice up did not become ready in 150s")
	}
	return upNode{}
}

// systemTest marks t as a system test: it starts a node, a cluster or an
// OS process of the binary, or runs the demo or a benchmark, and takes
// seconds to minutes. The fast tier (go test -short) skips it; .ci/run's
// full tier runs it.
func systemTest(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("system test: skipped by -short (the full tier runs it)")
	}
}

// startUp calls run("up") in-process with a config file, a temp data
// directory and free ports; the node stops when the test ends.
func startUp(t testing.TB, yaml string, env map[string]string) upNode {
	t.Helper()
	n := startUpWith(t, yaml, env, nil, io.Discard)
	waitReady(t, n.HTTP)
	return n
}

// startUpLogged is startUp at log level info, whose log is printed if the
// test fails.
func startUpLogged(t testing.TB, yaml string, env map[string]string) upNode {
	t.Helper()
	var log syncBuffer
	n := startUpWith(t, yaml, env, []string{"--log-level", "info"}, &log)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sluice up log:\n%s", log.String())
		}
	})
	waitReady(t, n.HTTP)
	return n
}

// startUpWith is startUp with extra flags and the node's stderr (its log);
// it does not wait for /readyz.
func startUpWith(t testing.TB, yaml string, env map[string]string, extra []string, stderr io.Writer) upNode {
	t.Helper()
	systemTest(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	getenv := func(k string) string { return env[k] }
	args := append([]string{"up", "--config", cfgPath, "--data", filepath.Join(dir, "data"),
		"--nats-listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-level", "warn"}, extra...)
	go func() {
		done <- run(ctx, args, getenv, pw, stderr)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sluice up returned %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("sluice up did not stop within 30s")
		}
	})
	n := waitUp(t, pr)
	nodeData.Store(n.NATS, filepath.Join(dir, "data"))
	return n
}

// waitReady waits until the node at base answers /readyz with 200.
func waitReady(t testing.TB, base string) {
	t.Helper()
	natstest.Eventually(t, 30*time.Second, func() error {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s/readyz: %d", base, resp.StatusCode)
		}
		return nil
	})
}

func natsClient(t testing.TB, url string) (*nats.Conn, *client.Client) {
	t.Helper()
	nc, err := nats.Connect(url, append(operatorOpts(t, url), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, c
}

// chatBody is a chat-completions body with a prompt of about words tokens.
func chatBody(model string, words, maxTokens int) []byte {
	return []byte(fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
		model, maxTokens, strings.TrimSpace(strings.Repeat("lorem ", words))))
}

// simConfig writes a Sluice config for one simulated provider.
func simConfig(simURL, model string, rpm, tpm int, extra string) string {
	return fmt.Sprintf(`
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: %s, rpm: %d, tpm: %d, max_concurrency: 128}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
  - {name: globex, api_key_env: GLOBEX_KEY}
  - {name: initech, api_key_env: INITECH_KEY, weight: 2}
%s`, simURL, model, rpm, tpm, extra)
}

// SLUICE_METRICS: each node's metrics on a port of its own, not the
// default one, so nodes of tests running at once do not collide.
var testEnv = map[string]string{"SLUICE_METRICS": "127.0.0.1:0", "SIM_KEY": "sim-secret", "ACME_KEY": "acme-key", "GLOBEX_KEY": "globex-key", "INITECH_KEY": "initech-key"}

func asErr[T error](err error, target *T) bool { return errors.As(err, target) }

func writeFile(path, data string) error { return os.WriteFile(path, []byte(data), 0o600) }
