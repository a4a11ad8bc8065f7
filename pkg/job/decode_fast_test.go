package job

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
)

// textStd is ChatMessage.Text decoded by encoding/json.
func textStd(m ChatMessage) string {
	if len(m.Content) == 0 || string(m.Content) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(m.Content, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return string(m.Content)
}

// decodesAsStd fails t unless what decodeFast decodes from data (an
// envelope as Parse reads it, a chat body as ParseRequest does, a
// message's content as Text does) encoding/json decodes too, to the same
// value: decodeFast may refuse more (encoding/json then decodes, and words
// the refusal), never less.
func decodesAsStd(t *testing.T, data []byte) {
	t.Helper()
	var fast, std envelope
	if decodeFast(data, &fast, jsonv2.RejectUnknownMembers(true)) {
		if err := decodeEnvelope(data, &std); err != nil {
			t.Fatalf("envelope %q: decodeFast decoded it, encoding/json refuses it: %v", data, err)
		}
		if !reflect.DeepEqual(fast, std) {
			t.Fatalf("envelope %q:\n fast %+v\n std  %+v", data, fast, std)
		}
	}
	var fr, sr ChatRequest
	if decodeFast(data, &fr) {
		if err := json.Unmarshal(data, &sr); err != nil {
			t.Fatalf("chat body %q: decodeFast decoded it, encoding/json refuses it: %v", data, err)
		}
		if !reflect.DeepEqual(fr, sr) {
			t.Fatalf("chat body %q:\n fast %+v\n std  %+v", data, fr, sr)
		}
	}
	m := ChatMessage{Content: data}
	if got, want := m.Text(), textStd(m); got != want {
		t.Fatalf("Text of %q: got %q, want %q", data, got, want)
	}
}

func decodeFastSeeds() []string {
	req := `{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"Say hello to the benchmark."}]}`
	return []string{
		`{"id":"a","tenant":"t","request":` + req + `}`,
		`{"tenant":"t","priority":"batch","idempotency_key":"k","deadline":"2030-01-02T03:04:05+05:30","task":"x","endpoint":"chat","cost":{"a":1},"at_least_once":true,"cache":{},"affinity":"u","request":` + req + `}`,
		`{"tenant":"t","TENANT":"u","request":{}}`, `{"tenant":"t","unknown":1}`, `{"tenant":"t"} x`, `{"tenant":"t"}{}`, `{"seal":"s","revs":{"a":1},"model":"m","tenant":"t"}`,
		`{"tenantſ":1}`, `{"ſeal":"s"}`, `{"cost":{"a":1.5}}`, `{"cost":{"a":1,"a":2}}`, `{"deadline":"x"}`, `{"deadline":null,"request":null}`,
		req, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","text":"b"}]}],"n":2,"stream":true,"stream_options":{"include_usage":true},"tools":[{"a":1}]}`,
		`{"model":"m","max_tokens":1.5}`, `{"model":"m","max_tokens":"1"}`, `{"MODEL":"m","Messages":[],"max_TOKENS":3}`, `{"model":"m","messages":[{"role":1}]}`,
		`"hi"`, `"\ud800x"`, "\"\xff\"", `[{"type":"text","text":"a"},{"text":"b"}]`, `[{"text":1}]`, `[1]`, `null`, `{}`, `1`, `true`, ` "a" `,
	}
}

func TestDecodeFastAsStd(t *testing.T) {
	t.Parallel()
	for _, s := range decodeFastSeeds() {
		decodesAsStd(t, []byte(s))
	}
}

func FuzzDecodeFast(f *testing.F) {
	for _, s := range decodeFastSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(decodesAsStd)
}

// BenchmarkDecodeFast compares encoding/json with decodeFast on the
// envelope and the body of `sluice bench overhead`'s job.
func BenchmarkDecodeFast(b *testing.B) {
	seeds := decodeFastSeeds()
	env, req := []byte(seeds[0]), []byte(seeds[13])
	b.Run("envelope/std", func(b *testing.B) {
		for b.Loop() {
			var in envelope
			_ = decodeEnvelope(env, &in)
		}
	})
	b.Run("envelope/fast", func(b *testing.B) {
		for b.Loop() {
			var in envelope
			_ = decodeFast(env, &in, jsonv2.RejectUnknownMembers(true))
		}
	})
	b.Run("request/std", func(b *testing.B) {
		for b.Loop() {
			var r ChatRequest
			_ = json.Unmarshal(req, &r)
		}
	})
	b.Run("request/fast", func(b *testing.B) {
		for b.Loop() {
			var r ChatRequest
			_ = decodeFast(req, &r)
		}
	})
}
