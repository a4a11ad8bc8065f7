// Package examples holds Sluice's example configurations, embedded so that
// `sluice init` writes the same bytes as the files in the repository.
package examples

import (
	"embed"
	"fmt"
	"sort"
	"strings"
)

//go:embed *.yaml
var files embed.FS

// Default is the example `sluice init` writes unless told otherwise: the
// provider simulator, no account needed.
const Default = "sim"

// Names lists the examples ("sim", "openai-anthropic"), sorted.
func Names() []string {
	entries, _ := files.ReadDir(".")
	var out []string
	for _, e := range entries {
		out = append(out, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(out)
	return out
}

// Config returns the example called name, as the file examples/<name>.yaml
// holds it.
func Config(name string) ([]byte, error) {
	data, err := files.ReadFile(name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("no example %q (want one of %s)", name, strings.Join(Names(), ", "))
	}
	return data, nil
}
