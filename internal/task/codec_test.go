package task

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// sameAsUnmarshal fails t unless decode reads data as json.Unmarshal does.
func sameAsUnmarshal(t *testing.T, data []byte, min int) {
	t.Helper()
	var got, want Task
	gotErr, wantErr := decode(data, &got, min), json.Unmarshal(data, &want)
	if (gotErr != nil) != (wantErr != nil) {
		t.Fatalf("%q: Decode %v, Unmarshal %v", data, gotErr, wantErr)
	}
	if wantErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\n Decode    %+v\n Unmarshal %+v", data, got, want)
	}
}

var decodeSeeds = []string{
	`{"id":"a","tenant":"t","request":{"model":"m","messages":[{"role":"user","content":"a \"quoted\" \\ back\\\\"}]},"seal":"s"}`,
	`{"id":"a","request" : [1, 2.5e3, true, null, "x\\\"}]", {"k": {}}] , "model":"m"}`,
	`{"request":"a string body","id":"a"}`,
	`{"request":123,"id":"a"}`,
	`{"request":null}`,
	`{"id":"a","request":{"a":1},"Request":{"b":2}}`,
	`{"id":"a","REQUEST":{"b":2}}`,
	`{"id":"a","\u0072equest":{"b":2}}`,
	`{"id":"a","requeſt":{"b":2}}`,
	`{"id":"a","request":{"a":1},"request":{"b":2}}`,
	`{"id":"a"}`, `[]`, `"x"`, `{}`, ` { } `,
	`{"id":"a","request":{"a":1}`, `{"id":"a","request":{"a":"}`, `{"id":"a","request":}`, `{"id":"a","request":{"a":1}}x`,
	"{\"id\":\"a\",\n\t\"request\" :\r\n {\"a\" : [ ] } ,\n \"attempts\":[{\"n\":1,\"outcome\":\"x\",\"provider\":\"p\",\"model\":\"m\",\"started_at\":\"2026-12-03T12:00:00Z\",\"duration_ms\":1}]}",
}

// Decode reads every task as json.Unmarshal does, body taken apart or not.
func TestDecodeIsUnmarshal(t *testing.T) {
	t.Parallel()
	big := strings.Repeat(`word \"x\" \\ `, 100)
	for _, s := range append(decodeSeeds,
		`{"id":"a","request":{"model":"m","messages":[{"role":"user","content":"`+big+`"}]},"seal":"s"}`,
	) {
		sameAsUnmarshal(t, []byte(s), 0)
		sameAsUnmarshal(t, []byte(s), minSplit)
	}
}

// A task encoded and decoded is the task, with a small body and a large.
func TestEncodeDecode(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{"model":"m"}`, `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", 1000) + `"}]}`} {
		j := sample(body)
		data, err := Encode(j)
		if err != nil {
			t.Fatal(err)
		}
		var got Task
		if err := Decode(data, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(&got, j) {
			t.Errorf("got %+v, want %+v", &got, j)
		}
	}
}

// FuzzDecode holds Decode to json.Unmarshal on valid JSON: the same task
// or the same failure. (On invalid JSON, Decode may take apart a body it
// does not check: the seal is what checks it, see codec.go.)
func FuzzDecode(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if json.Valid(data) {
			sameAsUnmarshal(t, data, 0)
		}
	})
}
