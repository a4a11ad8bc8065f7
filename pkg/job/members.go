package job

import (
	"bytes"
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
//
// The scan runs first and the text is validated only when the scan finds
// something to refuse (every body is checked, at ingest and by the
// token estimate: most pass, and then one walk of the text does): the
// answer is the one validating first gives.
func CheckMembers(field string, data []byte, into any) error {
	s := scans.Get().(*memberScan)
	s.b, s.i = data, 0
	err := s.value(false, guide(reflect.TypeOf(into)))
	clear(s.path[:cap(s.path)]) // no reference to data stays in the pool
	s.b, s.path, s.fold, s.seen = nil, s.path[:0], s.fold[:0], s.seen[:0]
	scans.Put(s)
	if err != nil && !json.Valid(data) {
		return nil
	}
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
	return string(appendFold(make([]byte, 0, len(name)), []byte(name)))
}

// appendFold appends name folded (FoldName) to dst.
func appendFold(dst, name []byte) []byte {
	for len(name) > 0 {
		r, n := rune(name[0]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRune(name)
			r = foldRune(r)
		} else if 'a' <= r && r <= 'z' {
			r -= 'a' - 'A'
		}
		dst = utf8.AppendRune(dst, r)
		name = name[n:]
	}
	return dst
}

// hasFoldPrefix reports whether name folded (FoldName) begins with
// prefix, which is folded already.
func hasFoldPrefix(name []byte, prefix string) bool {
	var buf [32]byte
	folded := appendFold(buf[:0], name[:min(len(name), 4*len(prefix))])
	return bytes.HasPrefix(folded, []byte(prefix))
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
	if !json.Valid(body) {
		return nil // the body's parser says why
	}
	return checkProducerMembers(field, body)
}

// checkProducerMembers is CheckProducerRequest of a body known to be valid
// JSON.
func checkProducerMembers(field string, body []byte) error {
	s := memberScan{b: body}
	s.space()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return nil // not an object: the body's parser says why
	}
	s.i++
	s.space()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		return nil
	}
	prefix := FoldName(ReservedPrefix)
	for {
		s.space()
		name, err := s.str(true)
		if err != nil {
			return invalid(field, "malformed JSON")
		}
		if hasFoldPrefix(name, prefix) {
			return invalid(joinField(field, clip.String(string(name), 64)), "is set by Sluice only (members named %s* are Sluice's own); a request may not carry it", ReservedPrefix)
		}
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return invalid(field, "malformed JSON")
		}
		s.i++
		if err := s.skip(); err != nil {
			return invalid(field, "malformed JSON")
		}
		if end, err := s.sep('}'); end || err != nil {
			if err != nil {
				return invalid(field, "malformed JSON")
			}
			return nil
		}
	}
}

// dupError: the object at path at names first and again alike, or (first
// "") names again, which reaches field only by folding.
type dupError struct{ first, again, field, at string }

// fields are a struct type's members as encoding/json names them: by
// exact name (with the type the scan follows into it: guide), and by
// folded name.
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
		f.exact[name] = guide(sf.Type)
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

// scans keeps memberScans' buffers from one check to the next.
var scans = sync.Pool{New: func() any { return new(memberScan) }}

// memberScan walks a JSON text (any text: on one that is not JSON it
// stops with an error, or none, wherever it finds itself), keeping the path to where it is
// (for the error) as a stack: a member's name, or an array index. Names
// are read as byte slices (of b where written plainly) and compared
// folded in the scratch buffer fold, so that a body's usual members cost
// no allocation: seen holds the names of the objects being read, each
// object's above the last of its parent's.
type memberScan struct {
	b    []byte
	i    int
	path []pathSeg
	fold []byte
	seen []seenName
}

type pathSeg struct {
	name  []byte
	index int // -1 for a member
}

// seenName is a member of an object being read: its name as decoded and
// as compared (folded, or as decoded within a JSON Schema), fold[from:to].
type seenName struct {
	name     []byte
	from, to int
}

// linearNames is how many members of one object are compared one by one
// before a map takes over (so a body of many members stays linear).
const linearNames = 32

// where is the path to the object being read, as "messages[0].content".
func (s *memberScan) where() string {
	var b strings.Builder
	for k, p := range s.path[:max(len(s.path)-1, 0)] {
		switch {
		case p.index >= 0:
			fmt.Fprintf(&b, "[%d]", p.index)
		case k > 0:
			b.WriteString("." + clip.String(string(p.name), 64))
		default:
			b.WriteString(clip.String(string(p.name), 64))
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
	base, foldBase := len(s.seen), len(s.fold)
	defer func() {
		s.path = s.path[:len(s.path)-1]
		clear(s.seen[base:]) // drop the references to decoded names
		s.seen, s.fold = s.seen[:base], s.fold[:foldBase]
	}()
	var many map[string]int // past linearNames: a compared name -> its index in seen
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
		from := len(s.fold)
		if free {
			s.fold = append(s.fold, name...)
		} else {
			s.fold = appendFold(s.fold, name)
		}
		key := s.fold[from:]
		if first := s.findSeen(base, key, many); first >= 0 {
			return &dupError{first: string(s.seen[first].name), again: string(name), at: s.where()}
		}
		s.seen = append(s.seen, seenName{name: name, from: from, to: len(s.fold)})
		many = s.indexSeen(base, many)
		next := elem
		if fs != nil {
			ft, ok := fs.exact[string(name)]
			if !ok {
				folded := key
				if free {
					folded = appendFold(s.fold[len(s.fold):], name)
				}
				if exact, folds := fs.fold[string(folded)]; folds {
					return &dupError{again: string(name), field: exact, at: s.where()}
				}
			}
			next = ft
		}
		s.path[len(s.path)-1].name = name
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return errScan
		}
		s.i++
		if err := s.value(free || freeForm[string(name)], next); err != nil {
			return err
		}
		if end, err := s.sep('}'); end || err != nil {
			return err
		}
	}
}

// findSeen is the index in seen of the member of the object read from
// base that compares as key, or -1.
func (s *memberScan) findSeen(base int, key []byte, many map[string]int) int {
	if many != nil {
		if k, ok := many[string(key)]; ok {
			return k
		}
		return -1
	}
	for k := base; k < len(s.seen); k++ {
		if bytes.Equal(s.fold[s.seen[k].from:s.seen[k].to], key) {
			return k
		}
	}
	return -1
}

// indexSeen keeps the map of an object's names once it has more than
// linearNames of them.
func (s *memberScan) indexSeen(base int, many map[string]int) map[string]int {
	n := len(s.seen) - base
	switch {
	case many != nil:
		last := s.seen[len(s.seen)-1]
		many[string(s.fold[last.from:last.to])] = len(s.seen) - 1
	case n > linearNames:
		many = make(map[string]int, 2*n)
		for k := base; k < len(s.seen); k++ {
			many[string(s.fold[s.seen[k].from:s.seen[k].to])] = k
		}
	}
	return many
}

// skip reads one value without looking into it.
func (s *memberScan) skip() error {
	s.space()
	depth := 0
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			if _, err := s.str(false); err != nil {
				return err
			}
			if depth == 0 {
				return nil
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 { // the close of the enclosing value: a scalar ended
				return nil
			}
			if depth--; depth == 0 {
				s.i++
				return nil
			}
		case ',':
			if depth == 0 {
				return nil
			}
		}
		s.i++
	}
	if depth > 0 {
		return errScan
	}
	return nil
}

// str reads a string and, when decode, returns it as encoding/json
// decodes it (escapes resolved, invalid UTF-8 as U+FFFD): a slice of the
// text when written plainly.
func (s *memberScan) str(decode bool) ([]byte, error) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, errScan
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
				return nil, nil
			}
			if plain && utf8.Valid(raw) {
				return raw[1 : len(raw)-1 : len(raw)-1], nil
			}
			var out string
			if json.Unmarshal(raw, &out) != nil {
				return nil, errScan
			}
			return []byte(out), nil
		}
		s.i++
	}
	return nil, errScan
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
