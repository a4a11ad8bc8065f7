package examples_test

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/examples"
	"github.com/sluice-dev/sluice/internal/config"
)

// Every example loads as is, and passes the checks `sluice up --check` makes
// once the variables its comments tell you to export are set.
func TestExamplesLoad(t *testing.T) {
	t.Parallel()
	names := examples.Names()
	if len(names) < 2 || !strings.Contains(strings.Join(names, " "), examples.Default) {
		t.Fatalf("Names: got %v, want at least the default %q and a real-provider example", names, examples.Default)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data, err := examples.Config(name)
			if err != nil {
				t.Fatal(err)
			}
			onDisk, err := os.ReadFile(name + ".yaml")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(data, onDisk) {
				t.Errorf("Config(%q) differs from %s.yaml", name, name)
			}
			c, err := config.Parse(data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(c.Providers) == 0 || len(c.Tenants) == 0 {
				t.Errorf("got %d providers and %d tenants, want at least one of each", len(c.Providers), len(c.Tenants))
			}
			// The variables the file names, with what the comments say to export.
			exported := exportedVars(string(data))
			_, ps := config.Check(data, func(k string) string { return exported[k] })
			if len(ps) > 0 {
				t.Errorf("Check with the exported variables %v: %v", exported, ps)
			}
			_, ps = config.Check(data, func(string) string { return "" })
			for _, p := range ps {
				if !strings.HasSuffix(p.Key, ".api_key_env") || !strings.Contains(p.Msg, "export ") {
					t.Errorf("Check with nothing exported: got %v, want only unset key variables, each saying what to export", p)
				}
			}
		})
	}
	if _, err := examples.Config("nope"); err == nil || !strings.Contains(err.Error(), examples.Default) {
		t.Errorf(`Config("nope"): got %v, want an error listing the examples`, err)
	}
}

// The simulator example must match what `sluice sim` serves by default.
func TestSimExampleMatchesSimulatorDefaults(t *testing.T) {
	t.Parallel()
	data, err := examples.Config("sim")
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	p, m, ok := c.ModelRef("gpt-4o-mini")
	if !ok {
		t.Fatal("the sim example does not serve gpt-4o-mini, the model `sluice sim` serves by default")
	}
	if got, want := p.BaseURL, "http://127.0.0.1:8090/v1"; got != want {
		t.Errorf("base_url: got %q, want %q (sluice sim --listen default)", got, want)
	}
	if m.RPM != 500 || m.TPM != 200000 {
		t.Errorf("limits: got %d/%d, want 500/200000 (sluice sim --models default)", m.RPM, m.TPM)
	}
	if p.APIKeyEnv != "" {
		t.Errorf("api_key_env: got %q, want none (the simulator takes any key)", p.APIKeyEnv)
	}
}

var exportLine = regexp.MustCompile(`export ((?:[A-Z_][A-Z0-9_]*=\S+\s*)+)`)

// exportedVars reads the `export NAME=value` lines of a file's comments.
func exportedVars(data string) map[string]string {
	out := map[string]string{}
	for _, m := range exportLine.FindAllStringSubmatch(data, -1) {
		for _, kv := range strings.Fields(m[1]) {
			k, v, _ := strings.Cut(kv, "=")
			out[k] = v
		}
	}
	return out
}
