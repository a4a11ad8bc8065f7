package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/systest"
)

// Most tests here start a node with internal/systest's fixture (node.Run,
// in-process). The helpers below are for what tests `sluice up` itself:
// its ready line, printed by an in-process run or by an OS process.

var (
	upLine      = regexp.MustCompile(`sluice up: nats (\S+), http (\S+),`)
	metricsLine = regexp.MustCompile(`, metrics (\S+)$`)
)

// waitUp reads a `sluice up` stdout stream until its ready line.
func waitUp(t testing.TB, r io.Reader) systest.Node {
	t.Helper()
	found := make(chan systest.Node, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if m := upLine.FindStringSubmatch(sc.Text()); m != nil {
				n := systest.Node{NATS: m[1], HTTP: "http://" + m[2]}
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
	return systest.Node{}
}

// upInProcess calls run("up") in-process with a config file, a temp data
// directory, free ports and extra flags, writing its log to stderr; the
// node stops when the test ends. It does not wait for /readyz.
func upInProcess(t testing.TB, yaml string, env map[string]string, extra []string, stderr io.Writer) systest.Node {
	t.Helper()
	systest.SkipShort(t)
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
		"--nats-listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--log-level", "warn"}, extra...)
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
	n.Data = filepath.Join(dir, "data")
	return n
}

func writeFile(path, data string) error { return os.WriteFile(path, []byte(data), 0o600) }
