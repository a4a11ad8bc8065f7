// Package fuzzci runs every fuzz target in the module for a bounded time,
// as part of the ordinary test command: the decoders on a trust boundary
// (envelopes, the guard, configuration, durations, auth and provider
// headers, usage) are fuzzed on every CI run, not only when someone
// remembers to.
//
// Each target runs alone (`go test -fuzz` takes one target per run) for
// SLUICE_FUZZTIME (default 6s) with one fuzzing worker, so the other test
// packages running beside it (some measure pacing in real time) keep a
// core. SLUICE_FUZZTIME=0 or -short skips them.
// A failure names the target and the input go test saved under
// testdata/fuzz: commit that file, it becomes a regression test.
package fuzzci

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
)

type target struct{ dir, name string }

// targets finds every func FuzzXxx(*testing.F) in the module's test files.
func targets(t *testing.T, root string) []target {
	var out []target
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Fuzz") || len(fn.Type.Params.List) != 1 {
				continue
			}
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			out = append(out, target{dir: "./" + filepath.ToSlash(rel), name: fn.Name.Name})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].dir+out[i].name < out[j].dir+out[j].name })
	return out
}

func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found")
		}
		dir = parent
	}
}

func TestFuzzTargets(t *testing.T) {
	budget := 6 * time.Second
	if v := os.Getenv("SLUICE_FUZZTIME"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SLUICE_FUZZTIME=%q: %v", v, err)
		}
		budget = d
	}
	if testing.Short() || budget <= 0 {
		t.Skip("fuzzing skipped (-short or SLUICE_FUZZTIME=0)")
	}
	root := moduleRoot(t)
	all := targets(t, root)
	// The trust-boundary decoders must be among them: a renamed or deleted
	// fuzzer should fail here, not silently stop running.
	for _, want := range []string{"FuzzDecode", "FuzzGuard", "FuzzParse", "FuzzDuration", "FuzzParseUsage", "FuzzParseRateLimit", "FuzzClassifyRateLimit", "FuzzParseRetryAfter", "FuzzParseWait", "FuzzAuthHeader"} {
		found := false
		for _, tg := range all {
			found = found || tg.name == want
		}
		if !found {
			t.Errorf("fuzz target %s not found in the module", want)
		}
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, tg := range all {
		t.Run(strings.TrimPrefix(tg.dir, "./")+"/"+tg.name, func(t *testing.T) {
			cmd := exec.Command(goBin, "test", "-run", "^$", "-fuzz", "^"+tg.name+"$", "-fuzztime", budget.String(), "-parallel", "1", "-timeout", "10m", tg.dir)
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("go test -fuzz %s %s: %v\n%s\nThe failing input is saved under %s/testdata/fuzz/%s: fix the bug and commit that file.",
					tg.name, tg.dir, err, out, tg.dir, tg.name)
			}
		})
	}
}
