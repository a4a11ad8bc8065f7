package main

import (
	"context"
	"encoding/json"
	"io"
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

var runHint = regexp.MustCompile(`docker run .* -e (\w+)=\S+ \S+ up`)

// The image's defaults run: its CMD with its ENV and the configuration it
// copies in, a fresh data directory, and the variable its usage comment
// says to pass. Addresses are loopback with free ports here; the image
// serves HTTP on 0.0.0.0:8080.
func TestImageDefaultsRun(t *testing.T) {
	t.Parallel()
	d := readDockerfile(t)
	if got := strings.Join(d.cmd, " "); got != "up" {
		t.Fatalf("Dockerfile CMD: got %q, want up", got)
	}
	src, ok := d.copies[d.env["SLUICE_CONFIG"]]
	if !ok {
		t.Fatalf("Dockerfile: nothing is copied to SLUICE_CONFIG %q (copies %v)", d.env["SLUICE_CONFIG"], d.copies)
	}
	if d.env["SLUICE_DATA"] == "" || d.env["SLUICE_HTTP"] != "0.0.0.0:8080" {
		t.Errorf("Dockerfile ENV: got %v, want SLUICE_DATA set and SLUICE_HTTP 0.0.0.0:8080", d.env)
	}
	data, _ := os.ReadFile(filepath.Join("..", "..", "deploy", "Dockerfile"))
	hint := runHint.FindStringSubmatch(string(data))
	if hint == nil {
		t.Fatal("Dockerfile: no `docker run ... -e NAME=value IMAGE up` in its comments")
	}
	env := map[string]string{}
	for k, v := range d.env {
		env[k] = v
	}
	env["SLUICE_CONFIG"] = filepath.Join("..", "..", src)
	env["SLUICE_DATA"] = filepath.Join(t.TempDir(), "data")
	env["SLUICE_HTTP"] = "127.0.0.1:0"
	env["SLUICE_NATS_LISTEN"] = "127.0.0.1:0"
	env[hint[1]] = "image-test-key"

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, d.cmd, func(k string) string { return env[k] }, pw, io.Discard)
		pw.Close()
	}()
	n := waitUp(t, pr)
	systest.WaitReady(t, n.HTTP)
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
