package task

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/job"
)

func sample(body string) *Task {
	deadline := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	t := New(job.Job{ID: "0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e", Tenant: "acme", Priority: job.Interactive, Deadline: &deadline,
		Task: "summarize", Endpoint: "request", IdempotencyKey: `"request":null`, Request: json.RawMessage(body)})
	t.SubmittedAt = deadline.Add(-time.Minute)
	t.Model = "gpt-4o-mini"
	t.Estimate = &job.Estimate{PromptTokens: 12, MaxTokens: 16}
	t.Reservation = &Reservation{ID: "7-0", Requests: 1, Tokens: 28, ReservedAt: deadline, ValidUntil: deadline.Add(time.Second), Sig: "s"}
	t.Revs = &Revs{Record: 3, Op: 4}
	t.Seal = "seal"
	t.WaitReason = `the request "request":null`
	return t
}

// Encode writes what json.Marshal writes for every body as ingest leaves
// it (compacted by the encoder: canonicalBody).
func TestEncodeIsMarshal(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"<b>&amp; \u2028 \"request\":null é"}],"request":null}`,
		` { "model" : "m" , "messages" : [ ] } `,
		`[1,2,3]`, `"request"`, `null`, ``,
		// Past minSplit, the body is written as it is.
		`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat(`<b>&amp; \u2028 \"request\":null é `, 40) + `"}],"request":null}`,
		` { "model" : "m" , "messages" : [ ` + strings.Repeat(`{"role":"user", "content":"x"} , `, 40) + `{} ] } `,
	} {
		var canon json.RawMessage // "": none (nil, encoded as null)
		if body != "" {
			var err error
			if canon, err = json.Marshal(json.RawMessage(body)); err != nil {
				t.Fatal(err)
			}
		}
		j := sample(string(canon))
		j.Request = canon
		got, err := Encode(j)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		want, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("body %s:\n got %s\nwant %s", body, got, want)
		}
		if string(j.Request) != string(canon) {
			t.Errorf("body %s: Encode changed the task's body to %s", body, j.Request)
		}
	}
}

// BenchmarkEncode encodes a task as admission publishes it, with a small
// body and with a 16 KB one, by json.Marshal and by Encode.
func BenchmarkEncode(b *testing.B) {
	for _, size := range []int{100, 16 << 10} {
		body, _ := json.Marshal(json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", size/5) + `"}]}`))
		j := sample(string(body))
		for name, enc := range map[string]func(*Task) ([]byte, error){"marshal": func(t *Task) ([]byte, error) { return json.Marshal(t) }, "encode": Encode} {
			b.Run(name+"/"+map[int]string{100: "small", 16 << 10: "16KB"}[size], func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := enc(j); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkDecode decodes a task as admission and the executor do
// (mesh.DecodeTask), with a small body and with a 16 KB one.
func BenchmarkDecode(b *testing.B) {
	for _, size := range []int{100, 16 << 10} {
		body, _ := json.Marshal(json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", size/5) + `"}]}`))
		data, _ := Encode(sample(string(body)))
		b.Run("unmarshal/"+map[int]string{100: "small", 16 << 10: "16KB"}[size], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var t Task
				if err := json.Unmarshal(data, &t); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("decode/"+map[int]string{100: "small", 16 << 10: "16KB"}[size], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var t Task
				if err := Decode(data, &t); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
