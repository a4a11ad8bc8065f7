package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Problem is one thing wrong with a configuration, named by its key path
// ("providers[0].models[1].rpm") and, when the key is in the file, the line
// it sits on.
type Problem struct {
	Key  string // "" for the file as a whole
	Line int    // 0 when the key is not in the file (a default)
	Msg  string
}

func (p Problem) String() string {
	s := p.Msg
	if p.Key != "" {
		s = p.Key + ": " + s
	}
	if p.Line > 0 {
		s += fmt.Sprintf(" (line %d)", p.Line)
	}
	return s
}

// Problems is every problem found in a configuration, in file order where
// the keys are in the file. It is the error Parse, Load and Validate return.
type Problems []Problem

func (ps Problems) Error() string {
	switch len(ps) {
	case 0:
		return "config: no problems"
	case 1:
		return "config: " + ps[0].String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "config: %d problems:", len(ps))
	for _, p := range ps {
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

// Check decodes and checks a YAML document and reports every problem it
// finds, not only the first: syntax, unknown keys, values of the wrong type,
// and every rule Validate enforces, each by key path and line. The
// configuration it returns has defaults filled; when there are problems it
// holds what could be decoded (for checks that need it, like CheckEnv) and
// must not be run.
//
// With getenv, Check also checks the environment the configuration needs:
// every api_key_env it names must be set. Parse passes nil.
func Check(data []byte, getenv func(string) string) (*Config, Problems) {
	var c Config
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		c.withDefaults()
		return &c, Problems{syntaxProblem(err)}
	}
	var doc *yaml.Node
	if len(root.Content) > 0 {
		doc = root.Content[0]
	}
	w := &walker{}
	if doc != nil {
		w.walk(doc, reflect.TypeFor[Config](), "")
		// The walk pruned what is at fault, so the rest decodes.
		if err := doc.Decode(&c); err != nil && len(w.problems) == 0 {
			w.add("", 0, "%v", err)
		}
	}
	c.withDefaults()
	all := w.problems
	found := c.problems()
	if getenv != nil {
		found = append(found, c.envProblems(getenv)...)
	}
	for _, p := range found {
		if coveredBy(p.Key, w.problems) {
			continue // its value was dropped: the problem above says why
		}
		if doc != nil {
			p.Line = lineOf(doc, p.Key)
		}
		all = append(all, p)
	}
	sort.SliceStable(all, func(i, j int) bool {
		// File order; keys the file does not hold (defaults) last.
		li, lj := all[i].Line, all[j].Line
		return li != 0 && (lj == 0 || li < lj)
	})
	return &c, all
}

// envProblems reports every variable the configuration names that is unset.
func (c *Config) envProblems(getenv func(string) string) Problems {
	var ps Problems
	for i, p := range c.Providers {
		if p.APIKeyEnv != "" && envName(p.APIKeyEnv) && strings.TrimSpace(getenv(p.APIKeyEnv)) == "" {
			ps = append(ps, Problem{Key: fmt.Sprintf("providers[%d].api_key_env", i),
				Msg: fmt.Sprintf("%s is not set; export %s=<your %s API key> (the key itself never sits in the file)", p.APIKeyEnv, p.APIKeyEnv, p.Name)})
		}
	}
	return append(ps, c.keyEnvProblems(getenv)...) // apikeys.go
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func syntaxProblem(err error) Problem {
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		return Problem{Line: n, Msg: "not valid YAML: " + m[2]}
	}
	return Problem{Msg: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
}

// coveredBy reports whether key is at or below a key with a structural
// problem (whose value was dropped before decoding).
func coveredBy(key string, structural Problems) bool {
	for _, s := range structural {
		if s.Key == "" || key == s.Key || strings.HasPrefix(key, s.Key+".") || strings.HasPrefix(key, s.Key+"[") {
			return true
		}
	}
	return false
}

// walker checks a YAML tree against the Go type it will decode into: every
// key must be a field, every leaf must decode into its field's type. It
// prunes what is at fault so the rest decodes.
type walker struct {
	problems Problems
}

func (w *walker) add(key string, line int, format string, args ...any) {
	w.problems = append(w.problems, Problem{Key: key, Line: line, Msg: fmt.Sprintf(format, args...)})
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// walk reports whether n may be decoded into a t.
func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) bool {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return true // absent: the zero value, then the default
	}
	for t.Kind() == reflect.Pointer && !reflect.PointerTo(t).Implements(unmarshalerType) && !t.Implements(unmarshalerType) {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return w.leaf(n, t, path)
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			w.add(path, n.Line, "must be a mapping of keys (%s), got %s", strings.Join(fieldNames(t), ", "), describe(n))
			return false
		}
		fields := structFields(t)
		w.mapping(n, path, func(key *yaml.Node) (reflect.Type, bool) {
			ft, ok := fields[key.Value]
			return ft, ok
		}, func(key *yaml.Node, kp string) {
			msg := "unknown key"
			if s := suggest(key.Value, fieldNames(t)); s != "" {
				msg += fmt.Sprintf("; did you mean %s?", s)
			} else {
				msg += fmt.Sprintf("; the keys here are %s", strings.Join(fieldNames(t), ", "))
			}
			w.add(kp, key.Line, "%s", msg)
		}, t)
		return true
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			w.add(path, n.Line, "must be a mapping, got %s", describe(n))
			return false
		}
		w.mapping(n, path, func(*yaml.Node) (reflect.Type, bool) { return t.Elem(), true }, nil, t)
		return true
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			w.add(path, n.Line, "must be a list, got %s", describe(n))
			return false
		}
		for i, e := range n.Content {
			if !w.walk(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)) {
				// Keep the indexes of the others: a null decodes to the zero value.
				n.Content[i] = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: e.Line, Column: e.Column}
			}
		}
		return true
	}
	return w.leaf(n, t, path)
}

// mapping walks the pairs of a mapping node and drops those at fault.
func (w *walker) mapping(n *yaml.Node, path string, field func(key *yaml.Node) (reflect.Type, bool), unknown func(key *yaml.Node, kp string), t reflect.Type) {
	seen := map[string]int{}
	kept := n.Content[:0:0]
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Value == "<<" && k.Tag == "!!merge" {
			// A merge key: its mappings hold keys of this same type.
			ok := true
			for _, m := range mergeSources(v) {
				ok = w.walk(m, t, path) && ok
			}
			if ok {
				kept = append(kept, k, v)
			}
			continue
		}
		kp := k.Value
		if path != "" {
			kp = path + "." + k.Value
		}
		if first, dup := seen[k.Value]; dup {
			w.add(kp, k.Line, "appears twice (first on line %d); keep one", first)
			continue
		}
		seen[k.Value] = k.Line
		ft, ok := field(k)
		if !ok {
			unknown(k, kp)
			continue
		}
		if w.walk(v, ft, kp) {
			kept = append(kept, k, v)
		}
	}
	n.Content = kept
}

func mergeSources(v *yaml.Node) []*yaml.Node {
	if v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	if v.Kind == yaml.SequenceNode {
		return v.Content
	}
	return []*yaml.Node{v}
}

// leaf decodes one value on its own to find whether it fits its type.
func (w *walker) leaf(n *yaml.Node, t reflect.Type, path string) bool {
	err := n.Decode(reflect.New(t).Interface())
	if err == nil {
		return true
	}
	var de *durationError
	switch {
	case errors.As(err, &de):
		w.add(path, n.Line, "%s", de.Error())
	case n.Kind == yaml.ScalarNode:
		w.add(path, n.Line, "must be %s, got %q", kindName(t), n.Value)
	default:
		w.add(path, n.Line, "must be %s, got %s", kindName(t), describe(n))
	}
	return false
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	}
	return "a " + t.String()
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "something else"
}

// structFields maps each YAML key of t (inline fields included) to its type.
func structFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			for k, v := range structFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

// fieldNames lists t's keys in declaration order.
func fieldNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case name == "-":
		case strings.Contains(opts, "inline"):
			out = append(out, fieldNames(f.Type)...)
		case name == "":
			out = append(out, strings.ToLower(f.Name))
		default:
			out = append(out, name)
		}
	}
	return out
}

// suggest returns the known key closest to a misspelt one, if any is close.
func suggest(key string, known []string) string {
	best, bestD := "", max(3, len(key)/3+1)
	for _, k := range known {
		if d := distance(key, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the optimal string alignment distance (Levenshtein with
// adjacent transpositions).
func distance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

var pathPart = regexp.MustCompile(`[^.\[\]]+|\[\d+\]`)

// lineOf returns the line of key ("providers[0].models[1].rpm") in the tree,
// or of its deepest ancestor the file holds; 0 when none.
func lineOf(n *yaml.Node, key string) int {
	line := 0
	for _, part := range pathPart.FindAllString(key, -1) {
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		var next *yaml.Node
		if strings.HasPrefix(part, "[") {
			i, _ := strconv.Atoi(strings.Trim(part, "[]"))
			if n.Kind == yaml.SequenceNode && i < len(n.Content) {
				next = n.Content[i]
				line = next.Line
			}
		} else if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == part {
					next = n.Content[i+1]
					line = n.Content[i].Line
					break
				}
			}
		}
		if next == nil {
			return line
		}
		n = next
	}
	return line
}
