package mesh

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	jsonv1 "github.com/go-json-experiment/json/v1"

	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// benchTask is a job as DISPATCH carries it in `sluice bench overhead`.
func benchTask() *task.Task {
	now := time.Now().UTC()
	return &task.Task{
		Job: job.Job{ID: job.NewID(), Tenant: "bench", Priority: job.Interactive,
			Request: json.RawMessage(`{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"Say hello to the benchmark."}]}`)},
		SubmittedAt: now, Model: "gpt-4o-mini", Estimate: &job.Estimate{PromptTokens: 14, MaxTokens: 16, Class: "short"},
		Reservation: &task.Reservation{ID: "29123456-0", Requests: 1, Tokens: 30, Slice: 29123456, Prompt: 14,
			ReservedAt: now, ValidUntil: now.Add(time.Second), SendAt: now, Sig: "3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
		Seal: "3q2+7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", Revs: &task.Revs{Record: 12345, Op: 12346},
		CacheTarget: &task.CacheTarget{}, Gated: true,
	}
}

// benchResult is a result of `sluice bench overhead`.
func benchResult() *job.Result {
	now := time.Now().UTC()
	cost := 0.0000123
	return &job.Result{JobID: job.NewID(), Tenant: "bench", Status: job.StatusSucceeded,
		Response: json.RawMessage(`{"id":"chatcmpl-sim-000000000001","object":"chat.completion","created":1764770000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor"},"finish_reason":"stop"}],"usage":{"prompt_tokens":14,"completion_tokens":16,"total_tokens":30}}`),
		Usage:    &job.Usage{PromptTokens: 14, CompletionTokens: 16, TotalTokens: 30}, Attempts: 1, Provider: "sim", Model: "gpt-4o-mini",
		SubmittedAt: now, CompletedAt: now, ProviderRequestID: "req_0123456789", Cost: &cost, UsageSource: job.UsageProvider}
}

// BenchmarkCodec compares encoding/json with the v1 API of
// go-json-experiment/json on what every job's trip encodes and decodes.
func BenchmarkCodec(b *testing.B) {
	tk, res := benchTask(), benchResult()
	op := &OpRecord{Key: "job:" + tk.ID, JobID: tk.ID, Tenant: "bench", State: OpInFlight, Provider: "sim", Model: "gpt-4o-mini",
		Attempt: 1, Sent: &SentMark{Attempt: 1, At: time.Now(), By: "0123456789abcdef"}, UpdatedAt: time.Now()}
	tkData, _ := task.Encode(tk)
	resData, _ := json.Marshal(res)
	opData, _ := json.Marshal(op)
	impls := []struct {
		name      string
		marshal   func(any) ([]byte, error)
		unmarshal func([]byte, any) error
	}{{"std", json.Marshal, json.Unmarshal}, {"v1", jsonv1.Marshal, jsonv1.Unmarshal}}
	for _, im := range impls {
		b.Run("task-encode/"+im.name, func(b *testing.B) {
			for b.Loop() {
				_, _ = im.marshal(tk)
			}
		})
		b.Run("task-decode/"+im.name, func(b *testing.B) {
			for b.Loop() {
				var t task.Task
				_ = im.unmarshal(tkData, &t)
			}
		})
		b.Run("result-encode/"+im.name, func(b *testing.B) {
			for b.Loop() {
				_, _ = im.marshal(res)
			}
		})
		b.Run("result-decode/"+im.name, func(b *testing.B) {
			for b.Loop() {
				var r job.Result
				_ = im.unmarshal(resData, &r)
			}
		})
		b.Run("op-encode/"+im.name, func(b *testing.B) {
			for b.Loop() {
				_, _ = im.marshal(op)
			}
		})
		b.Run("op-decode/"+im.name, func(b *testing.B) {
			for b.Loop() {
				var o OpRecord
				_ = im.unmarshal(opData, &o)
			}
		})
	}
}

// sameDecode fails t unless jsonv1.Unmarshal reads data into a T as
// encoding/json does: the same value, or both an error.
func sameDecode[T any](t *testing.T, data []byte) {
	t.Helper()
	var got, want T
	gotErr, wantErr := jsonv1.Unmarshal(data, &got), json.Unmarshal(data, &want)
	if (gotErr != nil) != (wantErr != nil) {
		t.Fatalf("%T %q: v1 %v, encoding/json %v", got, data, gotErr, wantErr)
	}
	if wantErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%T %q:\n v1            %+v\n encoding/json %+v", got, data, got, want)
	}
}

// decodeAsStd checks every type the hot path decodes with jsonv1.
func decodeAsStd(t *testing.T, data []byte) {
	t.Helper()
	sameDecode[job.Result](t, data)
	sameDecode[Record](t, data)
	sameDecode[OpRecord](t, data)
	sameDecode[JobFacts](t, data)
	sameDecode[task.Task](t, data)
}

func codecSeeds() []string {
	tk, res := benchTask(), benchResult()
	op := &OpRecord{Key: "k", JobID: "j", Tenant: "t", State: OpInFlight, Joiners: []string{"a", "b"}, Usage: &job.Usage{PromptTokens: 1},
		Sent: &SentMark{Attempt: 1, At: time.Unix(1764770000, 5).UTC(), By: "x"}, UpdatedAt: time.Unix(1764770000, 0).UTC()}
	rec := &Record{JobID: "j", Tenant: "t", Status: job.StatusSucceeded, Result: res, OpKey: "k"}
	facts := &JobFacts{Spend: &task.SpendHold{Amount: 5, Day: "20261203"}, Priority: job.Batch, QueueWaitMS: 3, User: "u"}
	var seeds []string
	for _, v := range []any{tk, res, op, rec, facts} {
		data, _ := json.Marshal(v)
		seeds = append(seeds, string(data))
	}
	return append(seeds,
		`{"JOB_ID":"a","job_id":"b","Job_Id":"c"}`, `{"job_id":"a","job_id":"b"}`, `{"jobſid":"a","ſtate":"x","ſtatus":"y"}`,
		`{"state":"in_flight","attempt":1.5}`, `{"attempt":"1"}`, `{"joiners":null,"usage":null,"sent":{}}`,
		`{"response":{"a":[1,2,{"b":null}]},"status":"succeeded","attempts":2,"cost":0.5}`, `{"response":"\ud800"}`,
		`{"submitted_at":"2026-12-03T12:00:00.123456789+01:00","completed_at":"not a time"}`, `{"result":{"job_id":"x"},"status":"failed"}`,
		`{"spend":{"amount":1e3}}`, `{"priority":"batch","queue_wait_ms":-1}`, `{"tenant":"\u0074\"x"}`, "{\"tenant\":\"\xff\"}",
		`null`, `[]`, `{}`, `"x"`, `1`, `{"job_id":null}`, `{"usage":{"prompt_tokens":1,"PROMPT_TOKENS":2}}`)
}

// The hot path decodes with go-json-experiment's v1 API, which is to read
// everything as encoding/json does (the same values, an error for the same
// inputs; only the error's text may differ).
func TestDecodeAsStd(t *testing.T) {
	t.Parallel()
	for _, s := range codecSeeds() {
		decodeAsStd(t, []byte(s))
	}
}

func FuzzDecodeAsStd(f *testing.F) {
	for _, s := range codecSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if json.Valid(data) {
			decodeAsStd(t, data)
		}
	})
}
