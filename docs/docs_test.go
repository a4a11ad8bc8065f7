// Package docs_test checks the documentation against the code and itself:
// every configuration block loads, and every relative link resolves.
package docs_test

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/metrics"
)

// markdownFiles are README.md and every docs/*.md, relative to this directory.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("docs/*.md: got %v, want the reference documents", files)
	}
	return append([]string{filepath.Join("..", "README.md")}, files...)
}

func read(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// fence opens a ```yaml block; the block ends at the next ```.
var fence = regexp.MustCompile("(?m)^```yaml\\s*\\n")

// partialMark, on the line before a ```yaml block, marks a snippet that is
// not a whole configuration; it is not loaded. (An HTML comment: GitHub does
// not show it.)
const partialMark = "<!-- sluice:partial -->"

// Every ```yaml block in README.md and docs/*.md is a whole configuration
// that loads as written, unless the line before it is <!-- sluice:partial -->.
func TestReadmeConfigsLoad(t *testing.T) {
	t.Parallel()
	loaded := map[string]int{}
	for _, path := range markdownFiles(t) {
		text := read(t, path)
		name := filepath.Base(path)
		for _, loc := range fence.FindAllStringIndex(text, -1) {
			start := loc[1]
			end := strings.Index(text[start:], "```")
			if end < 0 {
				t.Fatalf("%s: a ```yaml block at byte %d never ends", name, loc[0])
			}
			block := text[start : start+end]
			line := strings.Count(text[:start], "\n") + 1
			if strings.HasSuffix(strings.TrimRight(text[:loc[0]], "\n"), partialMark) {
				continue
			}
			loaded[name]++
			if _, err := config.Parse([]byte(block)); err != nil {
				t.Errorf("%s:%d: the yaml block does not load (mark a partial snippet with %s on the line before it): %v", name, line, partialMark, err)
			}
		}
	}
	if loaded["README.md"] < 1 {
		t.Errorf("README.md: loaded %d yaml blocks, want at least 1 (the Configuration section's)", loaded["README.md"])
	}
	if loaded["CONFIG.md"] < 2 {
		t.Errorf("CONFIG.md: loaded %d yaml blocks, want at least 2 (every key, and the adaptive one)", loaded["CONFIG.md"])
	}
}

var (
	link       = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	inlineCode = regexp.MustCompile("`[^`\n]*`")
	heading    = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *#*$`)
)

// prose is text without its fenced code blocks, whose lines are blanked so
// that line numbers stay true.
func prose(text string) string {
	lines := strings.Split(text, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			in = !in
			lines[i] = ""
		} else if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// anchors are the ids GitHub gives a file's headings: lower case, punctuation
// other than - and _ dropped, spaces as -, a repeat suffixed -1, -2, ...
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(prose(text), -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
				b.WriteRune(r)
			}
		}
		id := b.String()
		for n := 1; out[id]; n++ {
			id = b.String() + "-" + string(rune('0'+n))
		}
		out[id] = true
	}
	return out
}

// Every relative link in README.md and docs/*.md names a file that exists,
// and its #anchor, if any, a heading of that file.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, path := range markdownFiles(t) {
		text := prose(read(t, path))
		for _, m := range link.FindAllStringSubmatchIndex(inlineCode.ReplaceAllStringFunc(text, func(s string) string {
			return strings.Repeat(" ", len(s))
		}), -1) {
			target := text[m[2]:m[3]]
			line := strings.Count(text[:m[0]], "\n") + 1
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Join(filepath.Dir(path), file)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: link %q: %v", path, line, target, err)
					continue
				}
			}
			checked++
			if anchor == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			if !anchors(read(t, dest))[anchor] {
				t.Errorf("%s:%d: link %q: %s has no heading with id %q", path, line, target, dest, anchor)
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked %d relative links, want the documents' many", checked)
	}
}

// The README's two commands are what a newcomer runs first: the demo, and
// exactly the test command .ci/run ends with.
func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	readme := read(t, filepath.Join("..", "README.md"))
	ci := strings.TrimSpace(read(t, filepath.Join("..", ".ci", "run")))
	test := ci[strings.LastIndex(ci, "\n")+1:]
	if !strings.HasPrefix(test, "go test ") {
		t.Fatalf(".ci/run: its last line is %q, want the suite's go test command", test)
	}
	_, after, ok := strings.Cut(readme, "\n## Two commands\n")
	if !ok {
		t.Fatal("README.md: no \"## Two commands\" section")
	}
	block, _, _ := strings.Cut(after, "\n## ")
	for _, want := range []string{"\ngo run ./cmd/sluice demo ", "\n" + test + " "} {
		if !strings.Contains(block, want) {
			t.Errorf("README.md's Two commands lack the line starting %q", strings.TrimSpace(want))
		}
	}
}

// The README and ARCHITECTURE.md stay documents a reader finishes: the
// reference belongs in docs/, the measurements in BENCHMARKS.md.
func TestDocSizes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		path string
		max  int
	}{
		{filepath.Join("..", "README.md"), 30_000},
		{"ARCHITECTURE.md", 35_000},
	} {
		if n := len(read(t, c.path)); n > c.max {
			t.Errorf("%s: %d bytes, want at most %d: move reference material to docs/ and measurements to BENCHMARKS.md", c.path, n, c.max)
		}
	}
}

// yamlKeys are the keys of every struct reachable from t, by their yaml tags.
func yamlKeys(t reflect.Type, seen map[reflect.Type]bool, out map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] {
		return
	}
	seen[t] = true
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name != "" {
			out[name] = true
		}
		yamlKeys(f.Type, seen, out)
	}
}

// Every key the configuration accepts is documented in CONFIG.md.
func TestConfigKeysDocumented(t *testing.T) {
	t.Parallel()
	doc := read(t, "CONFIG.md")
	keys := map[string]bool{}
	yamlKeys(reflect.TypeFor[config.Config](), map[reflect.Type]bool{}, keys)
	if len(keys) < 50 {
		t.Fatalf("found %d configuration keys, want the whole file's", len(keys))
	}
	for k := range keys {
		if !regexp.MustCompile(`(?m)[\s{,]` + regexp.QuoteMeta(k) + `:`).MatchString(doc) {
			t.Errorf("configuration key %q is not documented in docs/CONFIG.md", k)
		}
	}
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

var fqName = regexp.MustCompile(`fqName: "([a-z0-9_]+)"`)

// Every metric Sluice registers is documented in METRICS.md.
func TestMetricsDocumented(t *testing.T) {
	t.Parallel()
	doc := read(t, "METRICS.md")
	var r recorder
	metrics.New(&r)
	ch := make(chan *prometheus.Desc, 256)
	go func() {
		for _, c := range r.cs {
			c.Describe(ch)
		}
		close(ch)
	}()
	n := 0
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in %v", d)
		}
		n++
		if !strings.Contains(doc, "`"+m[1]+"`") {
			t.Errorf("metric %s is not documented in docs/METRICS.md", m[1])
		}
	}
	if n < 30 {
		t.Errorf("found %d metrics, want every one Sluice registers", n)
	}
}
