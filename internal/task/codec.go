package task

import (
	"bytes"
	"encoding/json"
	"strconv"

	jsonv1 "github.com/go-json-experiment/json/v1"
)

// A request body is most of a task's bytes, and encoding/json scans a
// json.RawMessage twice when it decodes one (validating the whole text,
// then finding the value's end) and compacts it again when it encodes one:
// the cost of a 16 KB body at every hop, where the rest of the task is a
// few hundred bytes. The body is checked once, at ingest, which compacts
// it and seals those bytes (internal/guard: a SHA-256 of them under the
// fleet key's HMAC); every later hop verifies the seal before it trusts
// or sends the body, and a body under no valid seal is parsed and checked
// again there (guard.Queued) or refused (guard.Dispatched). So Encode and
// Decode carry the body's bytes as they are and leave its syntax to the
// seal; the rest of the task is encoded and decoded by encoding/json.
//
// Decoding, on every hop of every job, goes through the v1 API of
// github.com/go-json-experiment/json: encoding/json's semantics (the same
// values from the same text, case-insensitive names included; only an
// error's text may differ), implemented as Go 1.27's encoding/json is, in
// about half the time and a third of the allocations (mesh's
// BenchmarkCodec; FuzzDecode and mesh's FuzzDecodeAsStd hold it to
// encoding/json). Encoding is no faster there and stays with encoding/json.

// Encode is json.Marshal(t), with a request body of minSplit bytes or
// more written as it is rather than compacted again: a body from ingest
// (compacted there) or from Decode is written as json.Marshal would write
// it.
func Encode(t *Task) ([]byte, error) {
	if len(t.Request) < minSplit {
		return json.Marshal(t)
	}
	c := *t
	c.Request = nil
	data, err := json.Marshal(&c)
	if err != nil {
		return nil, err
	}
	// The members before request are scalars, and no JSON string holds
	// an unescaped quote: the first match is the member.
	at := bytes.Index(data, nullRequest)
	if at < 0 {
		return json.Marshal(t)
	}
	at += len(`"request":`)
	out := make([]byte, 0, len(data)-len("null")+len(t.Request))
	out = append(out, data[:at]...)
	out = append(out, t.Request...)
	return append(out, data[at+len("null"):]...), nil
}

var nullRequest = []byte(`"request":null`)

// minSplit is the body size from which Encode and Decode take the body
// apart: below it, encoding/json's scans cost less than the copies.
const minSplit = 512

// Decode is json.Unmarshal of a task, except that a body of minSplit bytes
// or more, named once as "request" (and by no other name encoding/json
// would match to it), is taken as it is, its syntax unchecked (see above):
// the rest of the text is decoded with null in its place.
func Decode(data []byte, t *Task) error { return decode(data, t, minSplit) }

func decode(data []byte, t *Task, min int) error {
	from, to, ok := requestValue(data)
	if !ok || to-from < min {
		return jsonv1.Unmarshal(data, t)
	}
	rest := make([]byte, 0, len(data)-(to-from)+len("null"))
	rest = append(rest, data[:from]...)
	rest = append(rest, "null"...)
	rest = append(rest, data[to:]...)
	if err := jsonv1.Unmarshal(rest, t); err != nil {
		return err
	}
	t.Request = bytes.Clone(data[from:to])
	return nil
}

// requestValue finds the value of the member "request" of the object data
// holds: data[from:to]. ok is false when data is no object, a member's
// name has an escape, or a name other than "request" (or a second one)
// matches it as encoding/json matches names (bytes.EqualFold); the caller
// then decodes the text whole.
func requestValue(data []byte) (from, to int, ok bool) {
	s := skimmer{b: data}
	s.space()
	if !s.take('{') {
		return 0, 0, false
	}
	found := false
	for {
		s.space()
		if s.take('}') {
			return from, to, found
		}
		name, plain := s.str()
		if !plain {
			return 0, 0, false
		}
		s.space()
		if !s.take(':') {
			return 0, 0, false
		}
		s.space()
		start := s.i
		if !s.value() || s.i == start {
			return 0, 0, false
		}
		if bytes.EqualFold(name, []byte("request")) {
			if found || string(name) != "request" {
				return 0, 0, false
			}
			from, to, found = start, s.i, true
		}
		s.space()
		if !s.take(',') && (s.i >= len(s.b) || s.b[s.i] != '}') {
			return 0, 0, false
		}
	}
}

// Members is what to decode in place of a request body to read its
// top-level members names into a struct: from minSplit bytes, an object of
// just those members (for each name, the last member encoding/json would
// match to it, as it would), found by skimming the body; otherwise, or when
// the body is no object or a member's name has an escape, the body itself.
// The body's syntax is left to its seal, as in Decode.
func Members(body []byte, names ...string) []byte { return members(body, minSplit, names...) }

func members(body []byte, min int, names ...string) []byte {
	if len(body) < min {
		return body
	}
	s := skimmer{b: body}
	s.space()
	if !s.take('{') {
		return body
	}
	vals := make([][]byte, len(names))
	for {
		s.space()
		if s.take('}') {
			break
		}
		name, plain := s.str()
		s.space()
		if !plain || !s.take(':') {
			return body
		}
		s.space()
		start := s.i
		if !s.value() || s.i == start {
			return body
		}
		for k, n := range names {
			if bytes.EqualFold(name, []byte(n)) {
				vals[k] = body[start:s.i]
			}
		}
		s.space()
		if !s.take(',') && (s.i >= len(s.b) || s.b[s.i] != '}') {
			return body
		}
	}
	out := []byte{'{'}
	for k, v := range vals {
		if v == nil {
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(strconv.AppendQuote(out, names[k]), ':')
		out = append(out, v...)
	}
	return append(out, '}')
}

// skimmer finds where JSON values end without checking them.
type skimmer struct {
	b []byte
	i int
}

func (s *skimmer) space() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

func (s *skimmer) take(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str reads a string: its content as written, and whether it has no
// escape. false also when there is no string.
func (s *skimmer) str() ([]byte, bool) {
	if !s.take('"') {
		return nil, false
	}
	start := s.i
	end := s.strEnd()
	if end < 0 {
		return nil, false
	}
	name := s.b[start:end]
	return name, bytes.IndexByte(name, '\\') < 0
}

// strEnd moves past the closing quote of a string whose opening quote is
// read, and returns the quote's index (-1: none). A quote is escaped when
// an odd number of backslashes precede it.
func (s *skimmer) strEnd() int {
	for {
		k := bytes.IndexByte(s.b[s.i:], '"')
		if k < 0 {
			s.i = len(s.b)
			return -1
		}
		q := s.i + k
		n := 0
		for p := q - 1; p >= s.i && s.b[p] == '\\'; p-- {
			n++
		}
		s.i = q + 1
		if n%2 == 0 {
			return q
		}
	}
}

// value moves past one value; false when the text ends first.
func (s *skimmer) value() bool {
	depth := 0
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			s.i++
			if s.strEnd() < 0 {
				return false
			}
			if depth == 0 {
				return true
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return true // the enclosing object's close: a scalar ended
			}
			depth--
			if depth == 0 {
				s.i++
				return true
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return true
			}
		}
		s.i++
	}
	return depth == 0
}
