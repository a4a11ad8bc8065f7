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

// picked is what the executor and the request log read of a body.
type picked struct {
	Stream        bool `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	User     string `json:"user"`
	Metadata struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
}

// sameMembers fails t unless the members read from data are what
// json.Unmarshal reads of data.
func sameMembers(t *testing.T, data []byte) {
	t.Helper()
	var got, want picked
	gotErr := json.Unmarshal(members(data, 0, "stream", "stream_options", "user", "metadata"), &got)
	wantErr := json.Unmarshal(data, &want)
	if (gotErr != nil) != (wantErr != nil) || wantErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: members read %+v (%v), Unmarshal %+v (%v)", data, got, gotErr, want, wantErr)
	}
}

var memberSeeds = []string{
	`{"model":"m","stream":true,"stream_options":{"include_usage":true},"user":"u","metadata":{"user_id":"x"},"messages":[{"role":"user","content":"\"user\":\"v\""}]}`,
	`{"stream":true,"STREAM":false,"User":"a","user":"b"}`,
	`{"stream":"yes"}`, `{"user":1,"stream":true}`, `{"metadata":{"user_id":2}}`, `{"stream":null,"user":null}`,
	`{"\u0073tream":true}`, `{"ſtream":true}`, `[]`, `null`, `"x"`, `{}`, ` { "stream" : true } `,
}

// Members reads what json.Unmarshal reads, on valid JSON.
func TestMembersAreUnmarshal(t *testing.T) {
	t.Parallel()
	for _, s := range memberSeeds {
		sameMembers(t, []byte(s))
	}
	big := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", 200) + `"}],"stream":true,"user":"u"}`)
	if got := Members(big, "stream"); string(got) != `{"stream":true}` {
		t.Errorf("Members of a large body: %s, want {\"stream\":true}", got)
	}
	if small := []byte(`{"stream":true,"user":"u"}`); string(Members(small, "stream")) != string(small) {
		t.Errorf("Members of a small body: not the body itself")
	}
}

func FuzzMembers(f *testing.F) {
	for _, s := range memberSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if json.Valid(data) {
			sameMembers(t, data)
		}
	})
}

// BenchmarkMembers reads a 16 KB body's stream flags, as the executor
// does, from the body and from its Members.
func BenchmarkMembers(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", 16<<10/5) + `"}],"stream":true,"user":"u"}`)
	b.Run("unmarshal", func(b *testing.B) {
		for b.Loop() {
			var p picked
			_ = json.Unmarshal(body, &p)
		}
	})
	b.Run("members", func(b *testing.B) {
		for b.Loop() {
			var p picked
			_ = json.Unmarshal(Members(body, "stream", "stream_options"), &p)
		}
	})
}
