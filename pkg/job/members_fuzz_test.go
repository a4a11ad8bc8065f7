package job

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// alikeByToken is CheckMembers' rule read another way, with encoding/json's
// own tokenizer and bytes.EqualFold (which encoding/json documents its
// matching as): whether an object of data names two members alike (the
// same name; or, outside a JSON Schema, names equal under folding).
func alikeByToken(t *testing.T, data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var walk func(free bool) bool
	walk = func(free bool) bool {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("token of valid JSON: %v", err)
		}
		alike := false
		switch tok {
		case json.Delim('{'):
			var names []string
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					t.Fatalf("member name: %v", err)
				}
				name := k.(string)
				for _, n := range names {
					alike = alike || n == name || (!free && bytes.EqualFold([]byte(n), []byte(name)))
				}
				names = append(names, name)
				alike = walk(free || freeForm[name]) || alike
			}
			_, _ = dec.Token()
		case json.Delim('['):
			for dec.More() {
				alike = walk(free) || alike
			}
			_, _ = dec.Token()
		}
		return alike
	}
	return walk(false)
}

// reading is a chat request as decoded from data, written out again and
// read as plain JSON (numbers as written): two readings of one body are
// equal when Sluice and a provider see the same request.
func reading(t *testing.T, data []byte) any {
	var r ChatRequest
	if err := json.Unmarshal(data, &r); err != nil {
		return err.Error()
	}
	out, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// FuzzCheckMembers fuzzes the body decoder's check for members named
// alike: on valid JSON it refuses exactly what the tokenizer finds alike,
// and any chat body ParseRequest accepts has one reading: decoded as it
// came, or after passing through a plain map (each member once, in
// another order, as a provider matching names exactly would take it),
// it is the same request.
func FuzzCheckMembers(f *testing.F) {
	for _, s := range []string{
		`{"model":"a","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"a","messages":[{"role":"user","content":"hi"}],"max_tokens":100000,"MAX_TOKENS":1}`,
		`{"model":"a","messages":[{"role":"user","content":"hi"}],"n":100,"N":1}`,
		`{"model":"a","messages":[{"role":"user","content":"` + "long prompt " + `"}],"MESSAGES":[{"role":"user","content":"hi"}]}`,
		`{"model":"a","MODEL":"b","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"a","\u006dodel":"b","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"a","MAX_TOKENS":1,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"a","messages":[{"role":"user","ROLE":"system","content":"hi"}]}`,
		`{"model":"a","stream":true,"ſtream":false,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"a","messages":[{"role":"user","content":"hi"}],"sluice_responses":{"input":[],"SLUICE_RESPONSES":1}}`,
		`{"model":"a","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"id":{},"ID":{}}}}}]}`,
		`{"model":"a","messages":[{"role":"user","content":[{"type":"text","text":"x","TEXT":"y"}]}]}`,
		`[{"a":1},{"a":2},{"b":{"c":[{"d":1,"D":2}]}}]`,
		`{"model":"a","max_tokens":12345678901234567,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := CheckMembers("request", data, nil)
		if json.Valid(data) {
			if alike := alikeByToken(t, data); alike != (err != nil) {
				t.Fatalf("%q: CheckMembers %v, but the tokenizer finds members alike: %v", data, err, alike)
			}
		} else if err != nil {
			t.Fatalf("%q: not JSON, yet CheckMembers refused it itself: %v", data, err)
		}
		if _, err := ParseRequest(data, Limits{}); err != nil {
			return
		}
		var plain map[string]any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&plain); err != nil {
			t.Fatalf("%q: accepted, yet not an object: %v", data, err)
		}
		again, err := json.Marshal(plain)
		if err != nil {
			t.Fatal(err)
		}
		if a, b := reading(t, data), reading(t, again); !reflect.DeepEqual(a, b) {
			t.Fatalf("%q accepted with two readings:\n as sent: %v\n as a map: %v", data, a, b)
		}
	})
}

// FuzzCheckProducerRequest holds the check for members only Sluice sets
// to its first reading: the body decoded into a map, each name folded.
func FuzzCheckProducerRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"a","sluice_responses":{}}`, `{"model":"a","SLUICE_x":1}`, `{"model":"a","ſluice_x":1}`,
		`{"a":[1,{"sluice_x":2}],"b":"sluice_"}`, `{"\u0073luice_x":1}`, `{"sluice":1,"x":{"y":[]}}`, `[{"sluice_x":1}]`,
		`null`, `{}`, `{"a":1 , "b" : [ "}" , "]" ] , "SLUICE_z" : null }`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var members map[string]json.RawMessage
		want := false
		if json.Unmarshal(data, &members) == nil {
			for name := range members {
				want = want || strings.HasPrefix(FoldName(name), FoldName(ReservedPrefix))
			}
		}
		if err := CheckProducerRequest("request", data); (err != nil) != want {
			t.Fatalf("%q: CheckProducerRequest %v, want refused %v", data, err, want)
		}
	})
}
