package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/systest"
)

// dockerfile is what deploy/Dockerfile sets for the running image.
type dockerfile struct {
	env    map[string]string
	copies map[string]string // destination → source in the repository
	cmd    []string
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	d := dockerfile{env: map[string]string{}, copies: map[string]string{}}
	final := strings.LastIndex(text, "\nFROM ") // the runtime stage
	for _, line := range strings.Split(text[final:], "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "ENV":
			for _, kv := range f[1:] {
				k, v, _ := strings.Cut(kv, "=")
				d.env[k] = v
			}
		case "COPY":
			if len(f) == 3 && !strings.HasPrefix(f[1], "--") {
				d.copies[f[2]] = f[1]
			}
		case "CMD":
			if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(line), "CMD")), &d.cmd); err != nil {
				t.Fatalf("Dockerfile CMD: %v", err)
			}
		}
	}
	return d
}

var runHint = regexp.MustCompile(`docker run .* -e (\w+)=\S+ sluice (up.*)`)

// The image's defaults run end to end: its CMD (`up` with the simulator
// in-process) with its ENV and the configuration it copies in, a fresh data
// directory and the variable its usage comment says to pass, answer a chat
// completion with nothing else running. Addresses are loopback with free
// ports here (the simulator's too: the configuration's base_url and the
// --sim address are moved together); the image serves HTTP on 0.0.0.0:8080.
func TestImageDefaultsRun(t *testing.T) {
	t.Parallel()
	systest.SkipShort(t)
	d := readDockerfile(t)
	data, _ := os.ReadFile(filepath.Join("..", "..", "deploy", "Dockerfile"))
	hint := runHint.FindStringSubmatch(string(data))
	if hint == nil {
		t.Fatal("Dockerfile: no `docker run ... -e NAME=value sluice up ...` in its comments")
	}
	if got := strings.Join(d.cmd, " "); got != hint[2] || len(d.cmd) != 3 || d.cmd[0] != "up" || d.cmd[1] != "--sim" {
		t.Fatalf("Dockerfile CMD %q: want `up --sim ADDR`, the same as its comment's docker run (%q)", got, hint[2])
	}
	src, ok := d.copies[d.env["SLUICE_CONFIG"]]
	if !ok {
		t.Fatalf("Dockerfile: nothing is copied to SLUICE_CONFIG %q (copies %v)", d.env["SLUICE_CONFIG"], d.copies)
	}
	if d.env["SLUICE_DATA"] == "" || d.env["SLUICE_HTTP"] != "0.0.0.0:8080" {
		t.Errorf("Dockerfile ENV: got %v, want SLUICE_DATA set and SLUICE_HTTP 0.0.0.0:8080", d.env)
	}
	yaml, err := os.ReadFile(filepath.Join("..", "..", src))
	if err != nil {
		t.Fatal(err)
	}
	simAddr := d.cmd[2]
	if !strings.Contains(string(yaml), "base_url: http://"+simAddr+"/v1") {
		t.Fatalf("%s: no provider's base_url is the image's --sim %s", src, simAddr)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "sluice.yaml")
	if err := writeFile(cfgPath, strings.ReplaceAll(string(yaml), simAddr, free)); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for k, v := range d.env {
		env[k] = v
	}
	env["SLUICE_CONFIG"] = cfgPath
	env["SLUICE_DATA"] = filepath.Join(dir, "data")
	env["SLUICE_HTTP"] = "127.0.0.1:0"
	env["SLUICE_NATS_LISTEN"] = "127.0.0.1:0"
	env["SLUICE_METRICS"] = "127.0.0.1:0"
	env[hint[1]] = "image-test-key"

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{d.cmd[0], d.cmd[1], free}, func(k string) string { return env[k] }, pw, io.Discard)
		pw.Close()
	}()
	n := waitUp(t, pr)
	systest.WaitReady(t, n.HTTP)
	req, _ := http.NewRequest(http.MethodPost, n.HTTP+"/v1/chat/completions", bytes.NewReader(systest.ChatBody("gpt-4o-mini", 5, 16)))
	req.Header.Set("Authorization", "Bearer image-test-key")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"chat.completion"`) {
		t.Errorf("chat completion through the image's defaults: %d %s, want 200 and a completion", resp.StatusCode, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("up with the image's defaults returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("up did not stop within 30s")
	}
}
