package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice/internal/systest"
	"github.com/sluice-dev/sluice/pkg/sim"
)

type composeFile struct {
	Services map[string]struct {
		Command     []string          `yaml:"command"`
		Volumes     []string          `yaml:"volumes"`
		Environment map[string]string `yaml:"environment"`
	} `yaml:"services"`
}

// TestComposeAuthRuns runs compose.yaml's NATS authentication without
// Docker (images cannot be pulled here): the nats-auth service's command
// line with its environment, then a nats-server loading what nats-1 mounts
// (deploy/nats/nats-1.conf and the file nats-auth wrote; one node: its
// cluster block, ports and store are replaced, nothing else), then every
// `sluice up` service of compose with its environment, pointed at that
// server. Nobody connects anonymously; each service connects with the nkey
// nats-auth wrote for it; a tenant's chat completion succeeds.
func TestComposeAuthRuns(t *testing.T) {
	t.Parallel()
	systest.SkipShort(t)
	raw, err := os.ReadFile("../../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	_, simURL := systest.StartSim(t, sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 500, TPM: 200000}}})
	dir := t.TempDir()
	cfgYAML, err := os.ReadFile("../../deploy/sluice.compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "sluice.yaml")
	if err := writeFile(cfgPath, strings.ReplaceAll(string(cfgYAML), "http://sim:8090", simURL)); err != nil {
		t.Fatal(err)
	}
	// The image's data directory, and compose's two volumes in it.
	data := filepath.Join(dir, "data")
	for _, d := range []string{"secrets", "nats-auth"} {
		if err := os.MkdirAll(filepath.Join(data, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	local := func(s string) string { return strings.Replace(s, "/var/lib/sluice", data, 1) }
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	gen := c.Services["nats-auth"]
	env := map[string]string{"SLUICE_DATA": data}
	for k, v := range gen.Environment {
		env[k] = v
	}
	env["SLUICE_CONFIG"] = cfgPath
	var args []string
	for _, a := range gen.Command {
		args = append(args, local(a))
	}
	var stderr bytes.Buffer
	if err := run(ctx, args, func(k string) string { return env[k] }, io.Discard, &stderr); err != nil {
		t.Fatalf("compose's nats-auth (%v): %v\n%s", args, err, stderr.String())
	}

	url := startComposeNATS(t, c, filepath.Join(data, "nats-auth", "sluice-auth.conf"))
	if nc, err := nats.Connect(url, nats.Timeout(3*time.Second)); err == nil || !errors.Is(err, nats.ErrAuthorization) {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("anonymous connection to compose's NATS: %v, want an authorization error", err)
	}

	var front systest.Node
	for name, s := range c.Services {
		if len(s.Command) == 0 || s.Command[0] != "up" {
			continue
		}
		env := map[string]string{}
		for k, v := range s.Environment {
			env[k] = v
		}
		for k, v := range map[string]string{"SLUICE_CONFIG": cfgPath, "SLUICE_DATA": data, "SLUICE_NATS_URL": url, "SLUICE_REPLICAS": "1",
			"SLUICE_HTTP": "127.0.0.1:0", "SLUICE_METRICS": "127.0.0.1:0", "SLUICE_LOG_LEVEL": "warn"} {
			env[k] = v
		}
		n := runService(t, ctx, name, s.Command, env)
		if strings.Contains(env["SLUICE_SERVICES"], "ingest") {
			front = n
		}
	}
	if front.HTTP == "" {
		t.Fatal("compose.yaml: no `sluice up` service runs ingest")
	}
	systest.WaitReady(t, front.HTTP)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.HTTP+"/v1/chat/completions", bytes.NewReader(systest.ChatBody("gpt-4o-mini", 5, 16)))
	req.Header.Set("Authorization", "Bearer "+c.Services["sluice"].Environment["ACME_SLUICE_KEY"])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("chat completion through compose's services: %d %s, want 200", resp.StatusCode, body)
	}
}

// startComposeNATS starts a nats-server from what compose's nats-1 mounts:
// its configuration, with auth (the generated file) beside it. Only the
// listeners, the cluster block and the store directory are replaced.
func startComposeNATS(t *testing.T, c composeFile, authFile string) string {
	t.Helper()
	var confPath string
	for _, v := range c.Services["nats-1"].Volumes {
		if src, ok := strings.CutSuffix(v, ":/etc/nats/nats.conf:ro"); ok {
			confPath = filepath.Join("..", "..", src)
		}
	}
	conf, err := os.ReadFile(confPath)
	if err != nil {
		t.Fatalf("nats-1's configuration %q: %v", confPath, err)
	}
	auth, err := os.ReadFile(authFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "auth"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeFile(filepath.Join(dir, "auth", "sluice-auth.conf"), string(auth)); err != nil {
		t.Fatal(err)
	}
	if err := writeFile(filepath.Join(dir, "nats.conf"), string(conf)); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("nats-server refuses nats-1's configuration with the generated accounts: %v", err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.Cluster, opts.Routes = server.ClusterOpts{}, nil
	opts.StoreDir = filepath.Join(dir, "js")
	opts.NoSigs, opts.NoLog = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

// runService runs one compose service's `sluice up` command line in-process
// until the test ends, and waits for its ready line (or its end).
func runService(t *testing.T, ctx context.Context, name string, args []string, env map[string]string) systest.Node {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	var log systest.SyncBuffer
	go func() {
		err := run(ctx, args, func(k string) string { return env[k] }, pw, &log)
		pw.Close()
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: sluice up returned %v\n%s", name, err, log.String())
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s: sluice up did not stop within 30s", name)
		}
	})
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		if m := upLine.FindStringSubmatch(sc.Text()); m != nil {
			go func() { _, _ = io.Copy(io.Discard, pr) }()
			return systest.Node{NATS: m[1], HTTP: "http://" + m[2]}
		}
	}
	t.Fatalf("%s: sluice up ended before it was ready\n%s", name, log.String())
	return systest.Node{}
}
