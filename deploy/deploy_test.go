// Package deploy_test checks the deployment files against the code: image
// versions, paths and configurations that drift silently otherwise. (Docker
// itself is not needed: `docker compose config` is the check to run where it
// is installed.)
package deploy_test

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natsauth"
	"github.com/sluice-dev/sluice/internal/node"
)

type compose struct {
	Services map[string]service `yaml:"services"`
	Volumes  map[string]any     `yaml:"volumes"`
}

type service struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Volumes     []string          `yaml:"volumes"`
	Environment map[string]string `yaml:"environment"`
	DependsOn   any               `yaml:"depends_on"` // a list of names, or name -> {condition}
}

// mount returns the source mounted at target ("" when none).
func (s service) mount(target string) string {
	for _, v := range s.Volumes {
		f := strings.Split(v, ":")
		if len(f) >= 2 && f[1] == target {
			return f[0]
		}
	}
	return ""
}

// after returns the condition s waits for on dep ("" when it does not
// depend on it; "service_started" for a plain list entry).
func (s service) after(dep string) string {
	switch d := s.DependsOn.(type) {
	case []any:
		for _, n := range d {
			if n == dep {
				return "service_started"
			}
		}
	case map[string]any:
		if c, ok := d[dep].(map[string]any); ok {
			cond, _ := c["condition"].(string)
			return cond
		}
	}
	return ""
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

// flagValue returns the value after flag in args ("" when absent).
func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// NATS authentication is on in compose: a one-shot `sluice nats-auth`
// service writes the accounts block into a volume every NATS node mounts
// where its configuration includes it (and the nodes start after it), and
// the services' nkeys into a volume every `sluice up` service mounts at its
// data directory's secrets/ (and they start after it), with a role set for
// each service's SLUICE_SERVICES and each tenant's key in its environment.
func TestComposeNATSAuth(t *testing.T) {
	t.Parallel()
	c := readCompose(t)
	var gen string
	for name, s := range c.Services {
		if len(s.Command) > 0 && s.Command[0] == "nats-auth" {
			gen = name
		}
	}
	if gen == "" {
		t.Fatal("compose.yaml: no service runs `sluice nats-auth`")
	}
	g := c.Services[gen]
	out := flagValue(g.Command, "--out")
	if out == "" || !strings.HasSuffix(out, "/sluice-auth.conf") {
		t.Fatalf("%s: --out %q, want a file sluice-auth.conf", gen, out)
	}
	authVol := g.mount(strings.TrimSuffix(out, "/sluice-auth.conf"))
	const data = "/var/lib/sluice" // the image's SLUICE_DATA (Dockerfile)
	if d := flagValue(g.Command, "--data"); d != "" && d != data {
		t.Fatalf("%s: --data %s, want the image's %s", gen, d, data)
	}
	secretsVol := g.mount(data + "/secrets")
	if _, ok := c.Volumes[authVol]; !ok || authVol == "" {
		t.Errorf("%s: --out %s is not on a named volume (%v)", gen, out, g.Volumes)
	}
	if _, ok := c.Volumes[secretsVol]; !ok || secretsVol == "" || secretsVol == authVol {
		t.Errorf("%s: %s/secrets is not on a named volume of its own (%v): the NATS nodes must not see the seeds", gen, data, g.Volumes)
	}
	sets := strings.Split(flagValue(g.Command, "--sets"), ",")

	cfg, err := config.Load("sluice.compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	nNATS, nUp := 0, 0
	for name, s := range c.Services {
		switch {
		case strings.HasPrefix(s.Image, "nats:"):
			nNATS++
			conf, err := os.ReadFile(strings.TrimPrefix(s.mount("/etc/nats/nats.conf"), "./deploy/"))
			if err != nil {
				t.Errorf("%s: its /etc/nats/nats.conf: %v", name, err)
				continue
			}
			if !strings.Contains(string(conf), `include "auth/sluice-auth.conf"`) || s.mount("/etc/nats/auth") != authVol {
				t.Errorf("%s: want its configuration to include auth/sluice-auth.conf from volume %s at /etc/nats/auth (%v)", name, authVol, s.Volumes)
			}
			if s.after(gen) != "service_completed_successfully" {
				t.Errorf("%s: starts before %s has written its accounts", name, gen)
			}
		case len(s.Command) > 0 && s.Command[0] == "up":
			nUp++
			if s.mount(data+"/secrets") != secretsVol {
				t.Errorf("%s: no volume %s at %s/secrets: it has no NATS identity (%v)", name, secretsVol, data, s.Volumes)
			}
			if s.after(gen) != "service_completed_successfully" {
				t.Errorf("%s: starts before %s has written its identity", name, gen)
			}
			roles, err := node.ParseServices(s.Environment["SLUICE_SERVICES"])
			if err != nil {
				t.Errorf("%s: SLUICE_SERVICES: %v", name, err)
			} else if set := natsauth.SetName(roles); !slices.Contains(sets, set) {
				t.Errorf("%s: role set %s is not among %s's --sets %v", name, set, gen, sets)
			}
			for _, tn := range cfg.Tenants {
				if s.Environment[tn.APIKeyEnv] != g.Environment[tn.APIKeyEnv] || g.Environment[tn.APIKeyEnv] == "" {
					t.Errorf("%s: tenant %s's key %s differs from %s's (NATS would refuse its password)", name, tn.Name, tn.APIKeyEnv, gen)
				}
			}
		}
	}
	if nNATS != 3 || nUp < 4 {
		t.Errorf("compose.yaml: %d NATS nodes and %d `sluice up` services, want 3 and at least 4", nNATS, nUp)
	}
}

// NATS is monitored: one prometheus-nats-exporter per node, reading its
// monitoring port with -varz and -jsz (the dashboard's NATS panels), each
// scraped by Prometheus's job nats.
func TestComposeNATSExporters(t *testing.T) {
	t.Parallel()
	c := readCompose(t)
	prom, err := os.ReadFile("prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var pc struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(prom, &pc); err != nil {
		t.Fatal(err)
	}
	scraped := map[string]bool{}
	for _, sc := range pc.ScrapeConfigs {
		if sc.JobName == "nats" {
			for _, s := range sc.StaticConfigs {
				for _, tg := range s.Targets {
					scraped[tg] = true
				}
			}
		}
	}
	for name, s := range c.Services {
		if !strings.HasPrefix(s.Image, "nats:") {
			continue
		}
		found := false
		for ename, e := range c.Services {
			if !strings.HasPrefix(e.Image, "natsio/prometheus-nats-exporter:") || !slices.Contains(e.Command, "http://"+name+":8222") {
				continue
			}
			found = true
			if !slices.Contains(e.Command, "-varz") || !slices.ContainsFunc(e.Command, func(a string) bool { return strings.HasPrefix(a, "-jsz") }) {
				t.Errorf("%s: command %v, want -varz and -jsz", ename, e.Command)
			}
			if !scraped[ename+":7777"] {
				t.Errorf("%s: %s:7777 is not a target of prometheus.yml's job nats (%v)", ename, ename, scraped)
			}
		}
		if !found {
			t.Errorf("%s: no prometheus-nats-exporter reads http://%s:8222", name, name)
		}
	}
}
