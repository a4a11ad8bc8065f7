package systest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/node"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/services/executor"
)

// SkipShort marks t as a system test: it starts a node, a cluster or an
// OS process of the binary, or runs the demo or a benchmark, and takes
// seconds to minutes. The fast tier (go test -short) skips it; .ci/run's
// full tier runs it.
func SkipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("system test: skipped by -short (the full tier runs it)")
	}
}

// Node is a running node, or one a test reached otherwise (a process of
// the binary): what a client needs to use it.
type Node struct {
	HTTP string // the API's base URL, http://host:port
	NATS string // the embedded server's client URL
	// NATSOptions connect to NATS as the operator.
	NATSOptions []nats.Option
	Metrics     string // the metrics listener's address ("": none)
	Data        string // the data directory, where the operator's identity is
	// Registry is the node's Prometheus registry (nil for a process).
	Registry *prometheus.Registry
}

// MetricsURL is the base URL of the node's metrics listener.
func (n Node) MetricsURL() string { return "http://" + n.Metrics }

// Connect connects to the node's NATS as the operator, with a client on
// the connection; both close when the test ends.
func (n Node) Connect(t testing.TB) (*nats.Conn, *client.Client) {
	t.Helper()
	return Connect(t, n.NATS, n.NATSOptions...)
}

// Connect connects to url with opts (reconnecting, as a service would)
// and makes a client on the connection; both close when the test ends.
func Connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, *client.Client) {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(natstest.ConnectTimeout)}, append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))...)...)
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

// Setup is how StartWith runs a node beyond its configuration.
type Setup struct {
	Env   map[string]string // the node's environment (API keys)
	Log   io.Writer         // the node's JSON log; nil discards it
	Level slog.Level        // the log's level
	// Executor overrides executor settings (a clock, say).
	Executor func(*executor.Config)
	// NATSURL joins that NATS instead of embedding a server, with the
	// identities kept in Data (the data directory of the node that
	// embeds it); Services runs only those services (nil: all).
	NATSURL, Data string
	Services      []string
	// Load and Reloads: see node.Options (nil: the node cannot reload).
	Load    func() (*config.Config, string, error)
	Reloads <-chan string
	// Stop, when it closes, stops the node before the test ends, handing
	// nothing over (a lost process, as far as its peers can tell).
	Stop <-chan struct{}
}

// Start runs a node from a YAML configuration, as `sluice up` would with
// a temporary data directory and free loopback ports (the API's, NATS's
// and, unless the configuration names one, the metrics listener's), and
// waits until it is ready. The node stops when the test ends; the test
// fails if it does not stop cleanly.
func Start(t testing.TB, yaml string, env map[string]string) Node {
	t.Helper()
	n := StartWith(t, yaml, Setup{Env: env, Level: slog.LevelWarn})
	WaitReady(t, n.HTTP)
	return n
}

// StartLogged is Start at log level info; the log is printed if the test
// fails.
func StartLogged(t testing.TB, yaml string, env map[string]string) Node {
	t.Helper()
	var log SyncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node log:\n%s", log.String())
		}
	})
	n := StartWith(t, yaml, Setup{Env: env, Log: &log, Level: slog.LevelInfo})
	WaitReady(t, n.HTTP)
	return n
}

// StartWith is Start with a Setup; it returns once the node serves,
// without waiting for /readyz.
func StartWith(t testing.TB, yaml string, s Setup) Node {
	t.Helper()
	SkipShort(t)
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("configuration: %v", err)
	}
	if cfg.Server.Metrics == "" {
		cfg.Server.Metrics = "127.0.0.1:0"
	}
	logTo := s.Log
	if logTo == nil {
		logTo = io.Discard
	}
	data := s.Data
	if data == "" {
		data = filepath.Join(t.TempDir(), "data")
	}
	ctx, cancel := context.WithCancel(context.Background())
	if s.Stop != nil {
		go func() {
			select {
			case <-s.Stop:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	ready := make(chan node.Info, 1)
	done := make(chan error, 1)
	go func() {
		done <- node.Run(ctx, node.Options{Config: cfg, NATSURL: s.NATSURL, Services: s.Services, NATSListen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Data: data,
			Getenv: func(k string) string { return s.Env[k] }, Executor: s.Executor, Load: s.Load, ReloadRequests: s.Reloads,
			Log:     slog.New(slog.NewJSONHandler(logTo, &slog.HandlerOptions{Level: s.Level})),
			OnReady: func(i node.Info) { ready <- i }})
	}()
	stopped := false
	t.Cleanup(func() {
		cancel()
		if stopped {
			return
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("node returned %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("node did not stop within 30s")
		}
	})
	select {
	case i := <-ready:
		return Node{HTTP: "http://" + i.HTTPAddr, NATS: i.NATSURL, NATSOptions: i.NATSOptions,
			Metrics: i.MetricsAddr, Data: data, Registry: i.Registry}
	case err := <-done:
		stopped = true
		t.Fatalf("node did not start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("node not serving after 60s")
	}
	return Node{}
}

// WaitReady waits until the node at base answers /readyz with 200.
func WaitReady(t testing.TB, base string) {
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
