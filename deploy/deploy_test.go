// Package deploy_test checks the deployment files against the code: image
// versions, paths and configurations that drift silently otherwise. (Docker
// itself is not needed: `docker compose config` is the check to run where it
// is installed.)
package deploy_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice/internal/config"
)

type compose struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Volumes     []string          `yaml:"volumes"`
		Environment map[string]string `yaml:"environment"`
	} `yaml:"services"`
}

func readCompose(t *testing.T) compose {
	t.Helper()
	data, err := os.ReadFile("../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	if len(c.Services) < 8 {
		t.Fatalf("compose.yaml: got %d services, want the NATS cluster, the simulator, Sluice, Prometheus and Grafana", len(c.Services))
	}
	return c
}

// The NATS image is the nats-server version Sluice embeds, so the cluster in
// compose runs what the tests run against.
func TestComposeNATSMatchesTheEmbeddedServer(t *testing.T) {
	t.Parallel()
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/nats-io/nats-server/v2 v(\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod: no nats-server requirement")
	}
	want := "nats:" + string(m[1]) + "-alpine"
	n := 0
	for name, s := range readCompose(t).Services {
		if strings.HasPrefix(s.Image, "nats:") {
			n++
			if s.Image != want {
				t.Errorf("compose.yaml %s: image %s, want %s (go.mod's nats-server)", name, s.Image, want)
			}
		}
	}
	if n != 3 {
		t.Errorf("compose.yaml: %d NATS services, want 3", n)
	}
}

// Every image names a version, and Prometheus is a supported one: 3.13 (LTS
// until July 2027) or later, not 3.5 (out of support since July 2026).
func TestComposeImagesArePinnedAndSupported(t *testing.T) {
	t.Parallel()
	for name, s := range readCompose(t).Services {
		_, tag, ok := strings.Cut(s.Image, ":")
		if !ok || tag == "" || tag == "latest" {
			t.Errorf("compose.yaml %s: image %q names no version", name, s.Image)
		}
		if repo, _, _ := strings.Cut(s.Image, ":"); repo == "prom/prometheus" {
			v := regexp.MustCompile(`^v(\d+)\.(\d+)\.`).FindStringSubmatch(tag)
			if v == nil {
				t.Errorf("compose.yaml %s: prometheus tag %q, want vMAJOR.MINOR.PATCH", name, tag)
				continue
			}
			major, _ := strconv.Atoi(v[1])
			minor, _ := strconv.Atoi(v[2])
			if major < 3 || (major == 3 && minor < 13) {
				t.Errorf("compose.yaml %s: prometheus %s, want 3.13 (LTS) or later", name, tag)
			}
		}
	}
}

// The configuration compose mounts loads, with the keys compose sets, at the
// path SLUICE_CONFIG names.
func TestComposeSluiceConfig(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("sluice.compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for name, s := range readCompose(t).Services {
		if len(s.Command) == 0 || s.Command[0] != "up" {
			continue
		}
		n++
		path := s.Environment["SLUICE_CONFIG"]
		mounted := false
		for _, v := range s.Volumes {
			mounted = mounted || v == "./deploy/sluice.compose.yaml:"+path+":ro"
		}
		if path == "" || !mounted {
			t.Errorf("compose.yaml %s: SLUICE_CONFIG %q is not where deploy/sluice.compose.yaml is mounted (%v)", name, path, s.Volumes)
		}
		if _, ps := config.Check(data, func(k string) string { return s.Environment[k] }); len(ps) > 0 {
			t.Errorf("deploy/sluice.compose.yaml with %s's environment: %v", name, ps)
		}
	}
	if n < 4 {
		t.Errorf("compose.yaml: %d `sluice up` services, want at least 4", n)
	}
}
