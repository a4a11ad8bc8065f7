package job

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/pkg/clip"
)

// A body is forwarded to the provider as it came, so what Sluice reads of
// it must be the only reading there is. Go's encoding/json matches a
// member to a struct field case-insensitively and lets the last of two
// same-named members win, where a provider may match exactly or take the
// first: {"max_tokens":100000,"MAX_TOKENS":1} would be budgeted as 1 and
// run as 100,000. CheckMembers refuses such a body before any decoder
// reads it.

// freeForm are the members whose values are JSON Schemas (a tool's
// parameters and input_schema, a response format's schema): Sluice
// carries them without reading them, and their property names may differ
// by case alone ("id" and "ID"). Within them only exact duplicates are
// refused.
var freeForm = map[string]bool{"parameters": true, "schema": true, "input_schema": true}

// CheckMembers refuses a JSON text in which one object names two members
// alike: the same name twice, or two names encoding/json matches to one
// field (equal under its case folding, as "max_tokens" and "MAX_TOKENS",
// or "\u006dodel" and "model"). Every object is checked, at any depth.
// into, when not nil, is what the text is decoded into (a struct, or a
// pointer to one): a member that reaches one of its fields only by
// folding ("MAX_TOKENS" alone, read as max_tokens) is refused too, since
// a provider matching names exactly would not read it so.
// field names the text in the error ("request", or "" for an envelope).
// A text that is not valid JSON passes: the decoder after it says why.
func CheckMembers(field string, data []byte, into any) error {
	if !json.Valid(data) {
		return nil
	}
	s := memberScan{b: data}
	err := s.value(false, guide(reflect.TypeOf(into)))
	var de *dupError
	switch {
	case errors.As(err, &de):
		at := field
		if de.at != "" {
			at = joinField(field, de.at)
		}
		if de.first == "" {
			return invalid(at, "member %q is read as %q: send it as %q (a provider matching names exactly would not read it)", clip.String(de.again, 64), clip.String(de.field, 64), clip.String(de.field, 64))
		}
		return invalid(at, "duplicate member %q (also as %q): name each member once; names that differ only in case would be read as one by Sluice and as two by the provider", clip.String(de.first, 64), clip.String(de.again, 64))
	case err != nil:
		// The scan disagrees with json.Valid: refuse rather than let a
		// body through unchecked.
		return invalid(field, "malformed JSON")
	}
	return nil
}

// FoldName is a member name as encoding/json folds it to match a struct
// field: two names with the same FoldName reach the same field.
func FoldName(name string) string {
	var b strings.Builder
	b.Grow(len(name))
	for _, r := range name {
		if r < utf8.RuneSelf {
			if 'a' <= r && r <= 'z' {
				r -= 'a' - 'A'
			}
			b.WriteRune(r)
			continue
		}
		b.WriteRune(foldRune(r))
	}
	return b.String()
}

// foldRune is the smallest rune of r's fold set (encoding/json's rule).
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// ReservedPrefix begins the names of the request members only Sluice's
// own handlers write (wire.NativeMember): a producer's body may not name
// one, in any case.
const ReservedPrefix = "sluice_"

// CheckProducerRequest refuses a producer's request body that names a
// member only Sluice sets (ReservedPrefix, compared as encoding/json
// compares names). field names the body in the error.
func CheckProducerRequest(field string, body []byte) error {
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil {
		return nil // not an object: the body's parser says why
	}
	prefix := FoldName(ReservedPrefix)
	for name := range members {
		if strings.HasPrefix(FoldName(name), prefix) {
			return invalid(joinField(field, clip.String(name, 64)), "is set by Sluice only (members named %s* are Sluice's own); a request may not carry it", ReservedPrefix)
		}
	}
	return nil
}

// dupError: the object at path at names first and again alike, or (first
// "") names again, which reaches field only by folding.
type dupError struct{ first, again, field, at string }

// fields are a struct type's members as encoding/json names them: by
// exact name (with the field's type), and by folded name.
type fields struct {
	exact map[string]reflect.Type
	fold  map[string]string
}

var fieldCache sync.Map // reflect.Type -> *fields

// alsoRead are members that other Sluice code reads of a body beyond its
// type's fields (a chat body: the answer cache's determinism, the
// affinity key), so that a case variant of them is refused too.
var alsoRead = map[reflect.Type][]string{
	reflect.TypeFor[ChatRequest](): {"temperature", "seed", "functions", "prompt_cache_key", "user"},
	reflect.TypeFor[Job]():         SluiceMembers,
}

var rawType = reflect.TypeFor[json.RawMessage]()

// guide is the type the scan follows for a value decoded into t: nil
// where the decoder does not look inside (no type, json.RawMessage, an
// interface, a type decoding itself).
func guide(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t == rawType || t.Kind() == reflect.Interface || reflect.PointerTo(t).Implements(reflect.TypeFor[json.Unmarshaler]()) {
		return nil
	}
	return t
}

func fieldsOf(t reflect.Type) *fields {
	if f, ok := fieldCache.Load(t); ok {
		return f.(*fields)
	}
	f := &fields{exact: map[string]reflect.Type{}, fold: map[string]string{}}
	for sf := range t.Fields() {
		if !sf.IsExported() {
			continue
		}
		name := sf.Name
		if tag, ok := sf.Tag.Lookup("json"); ok {
			n, _, _ := strings.Cut(tag, ",")
			if tag == "-" {
				continue
			}
			if n != "" {
				name = n
			}
		}
		f.exact[name] = sf.Type
		f.fold[FoldName(name)] = name
	}
	for _, name := range alsoRead[t] {
		f.exact[name] = nil
		f.fold[FoldName(name)] = name
	}
	fieldCache.Store(t, f)
	return f
}

func (e *dupError) Error() string { return "duplicate member " + strconv.Quote(e.first) }

var errScan = errors.New("malformed JSON")

// memberScan walks a valid JSON text, keeping the path to where it is
// (for the error) as a stack: a member's name, or an array index.
type memberScan struct {
	b    []byte
	i    int
	path []pathSeg
}

type pathSeg struct {
	name  string
	index int // -1 for a member
}

// where is the path to the object being read, as "messages[0].content".
func (s *memberScan) where() string {
	var b strings.Builder
	for k, p := range s.path[:max(len(s.path)-1, 0)] {
		switch {
		case p.index >= 0:
			fmt.Fprintf(&b, "[%d]", p.index)
		case k > 0:
			b.WriteString("." + clip.String(p.name, 64))
		default:
			b.WriteString(clip.String(p.name, 64))
		}
	}
	return b.String()
}

func (s *memberScan) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value reads one value, decoded into t (nil: not looked into); free
// says it is within a JSON Schema (freeForm).
func (s *memberScan) value(free bool, t reflect.Type) error {
	s.space()
	if s.i >= len(s.b) {
		return errScan
	}
	switch s.b[s.i] {
	case '{':
		return s.object(free, t)
	case '[':
		return s.array(free, t)
	case '"':
		_, err := s.str(false)
		return err
	}
	for s.i < len(s.b) { // a number, true, false or null
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return nil
		}
		s.i++
	}
	return nil
}

func (s *memberScan) array(free bool, t reflect.Type) error {
	var elem reflect.Type
	if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		elem = guide(t.Elem())
	}
	s.i++
	s.path = append(s.path, pathSeg{index: 0})
	defer func() { s.path = s.path[:len(s.path)-1] }()
	s.space()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return nil
	}
	for n := 0; ; n++ {
		s.path[len(s.path)-1].index = n
		if err := s.value(free, elem); err != nil {
			return err
		}
		if end, err := s.sep(']'); end || err != nil {
			return err
		}
	}
}

func (s *memberScan) object(free bool, t reflect.Type) error {
	var fs *fields
	var elem reflect.Type
	switch {
	case t == nil:
	case t.Kind() == reflect.Struct:
		fs = fieldsOf(t)
	case t.Kind() == reflect.Map:
		elem = guide(t.Elem())
	}
	s.i++
	s.path = append(s.path, pathSeg{index: -1})
	defer func() { s.path = s.path[:len(s.path)-1] }()
	var seen map[string]string // a name as compared -> as written
	s.space()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	for {
		s.space()
		name, err := s.str(true)
		if err != nil {
			return err
		}
		key := name
		if !free {
			key = FoldName(name)
		}
		if first, dup := seen[key]; dup {
			return &dupError{first: first, again: name, at: s.where()}
		}
		if seen == nil {
			seen = make(map[string]string, 8)
		}
		seen[key] = name
		next := elem
		if fs != nil {
			ft, ok := fs.exact[name]
			if exact, folds := fs.fold[FoldName(name)]; !ok && folds {
				return &dupError{again: name, field: exact, at: s.where()}
			}
			next = guide(ft)
		}
		s.path[len(s.path)-1].name = name
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return errScan
		}
		s.i++
		if err := s.value(free || freeForm[name], next); err != nil {
			return err
		}
		if end, err := s.sep('}'); end || err != nil {
			return err
		}
	}
}

// str reads a string and, when decode, returns it as encoding/json
// decodes it (escapes resolved, invalid UTF-8 as U+FFFD).
func (s *memberScan) str(decode bool) (string, error) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return "", errScan
	}
	start, plain := s.i, true
	s.i++
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '\\':
			plain = false
			s.i += 2
			continue
		case c == '"':
			s.i++
			raw := s.b[start:s.i]
			if !decode {
				return "", nil
			}
			if plain && utf8.Valid(raw) {
				return string(raw[1 : len(raw)-1]), nil
			}
			var out string
			if json.Unmarshal(raw, &out) != nil {
				return "", errScan
			}
			return out, nil
		}
		s.i++
	}
	return "", errScan
}

// sep reads what follows a member or an element: a comma (more follow) or
// the close of its object or array (end).
func (s *memberScan) sep(close byte) (end bool, err error) {
	s.space()
	if s.i >= len(s.b) {
		return false, errScan
	}
	s.i++
	switch s.b[s.i-1] {
	case ',':
		return false, nil
	case close:
		return true, nil
	}
	return false, errScan
}
