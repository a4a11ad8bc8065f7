package mesh_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// pricer prices a token at a unit of currency, except model "free-tier",
// which has no price.
type pricer struct{}

func (pricer) PriceResult(r *job.Result, source string) {
	r.Cost, r.CostUnpriced, r.UsageSource = nil, false, ""
	if r.Usage == nil {
		return
	}
	r.UsageSource = source
	if r.Model == "free-tier" {
		r.CostUnpriced = true
		return
	}
	c := float64(r.Usage.TotalTokens)
	r.Cost = &c
}

func costOf(v float64) *float64 { return &v }

// Conclude fills every field of a result from the job and the outcome,
// whoever ends the job.
func TestConclude(t *testing.T) {
	t.Parallel()
	sub := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := sub.Add(7 * time.Second)
	tried := &task.Task{Job: job.Job{ID: "j1", Tenant: "acme", Provider: "openai"}, Model: "gpt-4o", SubmittedAt: sub,
		Attempts: []job.Attempt{{N: 1}, {N: 2}}}
	usage := &job.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}
	shared := &job.Result{JobID: "j0", Tenant: "acme", Status: job.StatusSucceeded, Response: json.RawMessage(`{"a":1}`), Usage: usage,
		Attempts: 1, Provider: "openai", Model: "gpt-4o", SubmittedAt: sub.Add(-time.Minute), CompletedAt: sub.Add(-time.Second),
		ProviderRequestID: "req-0", TraceID: "trace-0", Cost: costOf(7), UsageSource: job.UsageProvider}
	for _, tc := range []struct {
		name  string
		t     *task.Task
		o     mesh.Outcome
		price mesh.Pricer
		want  job.Result
	}{{
		name:  "executor: answered, priced",
		t:     tried,
		o:     mesh.Outcome{Status: job.StatusSucceeded, Response: json.RawMessage(`{"b":2}`), Usage: usage, ProviderRequestID: "req-1"},
		price: pricer{},
		want: job.Result{JobID: "j1", Tenant: "acme", Status: job.StatusSucceeded, Response: json.RawMessage(`{"b":2}`), Usage: usage,
			Attempts: 2, Provider: "openai", Model: "gpt-4o", SubmittedAt: sub, CompletedAt: now, ProviderRequestID: "req-1",
			Cost: costOf(7), UsageSource: job.UsageProvider},
	}, {
		name:  "executor: interrupted stream, usage estimated, unpriced model",
		t:     &task.Task{Job: job.Job{ID: "j1", Tenant: "acme", Provider: "p"}, Model: "free-tier", SubmittedAt: sub, Attempts: []job.Attempt{{N: 1}}},
		o:     mesh.Outcome{Status: job.StatusInterrupted, Usage: usage, UsageSource: job.UsageEstimate, Error: &job.Error{Code: job.CodeStreamInterrupted}},
		price: pricer{},
		want: job.Result{JobID: "j1", Tenant: "acme", Status: job.StatusInterrupted, Usage: usage, Error: &job.Error{Code: job.CodeStreamInterrupted},
			Attempts: 1, Provider: "p", Model: "free-tier", SubmittedAt: sub, CompletedAt: now, CostUnpriced: true, UsageSource: job.UsageEstimate},
	}, {
		name:  "admission: expired after two attempts",
		t:     tried,
		o:     mesh.Outcome{Status: job.StatusExpired, Error: &job.Error{Code: job.CodeDeadlineExpired}},
		price: pricer{},
		want: job.Result{JobID: "j1", Tenant: "acme", Status: job.StatusExpired, Error: &job.Error{Code: job.CodeDeadlineExpired},
			Attempts: 2, Provider: "openai", Model: "gpt-4o", SubmittedAt: sub, CompletedAt: now},
	}, {
		name: "ingest: served from the cache, unpaid, by the entry's deployment",
		t:    &task.Task{Job: job.Job{ID: "j1", Tenant: "acme"}, SubmittedAt: sub},
		o:    mesh.Outcome{Status: job.StatusSucceeded, Response: json.RawMessage(`{"c":3}`), Usage: usage, Unpaid: true, Provider: "anthropic", Model: "claude"},
		want: job.Result{JobID: "j1", Tenant: "acme", Status: job.StatusSucceeded, Response: json.RawMessage(`{"c":3}`), Usage: usage,
			Provider: "anthropic", Model: "claude", SubmittedAt: sub, CompletedAt: now, Cost: costOf(0), UsageSource: job.UsageProvider},
	}, {
		name: "ingest: refused",
		t:    &task.Task{Job: job.Job{ID: "j1", Tenant: "acme"}, SubmittedAt: sub},
		o:    mesh.Outcome{Status: job.StatusFailed, Error: &job.Error{Code: job.CodeInvalidRequest}},
		want: job.Result{JobID: "j1", Tenant: "acme", Status: job.StatusFailed, Error: &job.Error{Code: job.CodeInvalidRequest}, SubmittedAt: sub, CompletedAt: now},
	}, {
		name: "result service: cancelled, in the job's trace",
		t:    &task.Task{Job: job.Job{ID: "j1", Tenant: "acme", Provider: "p"}, Model: "m", SubmittedAt: sub},
		o:    mesh.Outcome{Status: job.StatusCancelled, Error: &job.Error{Code: job.CodeCancelled}, TraceID: "trace-1"},
		want: job.Result{JobID: "j1", Tenant: "acme", Status: job.StatusCancelled, Error: &job.Error{Code: job.CodeCancelled}, Provider: "p", Model: "m",
			SubmittedAt: sub, CompletedAt: now, TraceID: "trace-1"},
	}, {
		name: "no price known: the usage's source all the same",
		t:    tried,
		o:    mesh.Outcome{Status: job.StatusSucceeded, Usage: usage},
		want: job.Result{JobID: "j1", Tenant: "acme", Status: job.StatusSucceeded, Usage: usage, Attempts: 2, Provider: "openai", Model: "gpt-4o",
			SubmittedAt: sub, CompletedAt: now, UsageSource: job.UsageProvider},
	}, {
		name:  "joined: the shared outcome, as this job's",
		t:     &task.Task{Job: job.Job{ID: "j2", Tenant: "acme"}, SubmittedAt: sub},
		o:     mesh.Outcome{Shared: shared},
		price: pricer{},
		want: job.Result{JobID: "j2", Tenant: "acme", Status: job.StatusSucceeded, Response: json.RawMessage(`{"a":1}`), Usage: usage,
			Attempts: 1, Provider: "openai", Model: "gpt-4o", SubmittedAt: sub, CompletedAt: sub.Add(-time.Second), DuplicateOf: "j0",
			ProviderRequestID: "req-0", TraceID: "trace-0", Cost: costOf(7), UsageSource: job.UsageProvider},
	}, {
		name: "joined, submission unknown: the shared one's",
		t:    &task.Task{Job: job.Job{ID: "j2", Tenant: "acme"}},
		o:    mesh.Outcome{Shared: shared},
		want: job.Result{JobID: "j2", Tenant: "acme", Status: job.StatusSucceeded, Response: json.RawMessage(`{"a":1}`), Usage: usage,
			Attempts: 1, Provider: "openai", Model: "gpt-4o", SubmittedAt: sub.Add(-time.Minute), CompletedAt: sub.Add(-time.Second), DuplicateOf: "j0",
			ProviderRequestID: "req-0", TraceID: "trace-0", Cost: costOf(7), UsageSource: job.UsageProvider},
	}} {
		got := mesh.Conclude(tc.t, tc.o, tc.price, now)
		if !reflect.DeepEqual(*got, tc.want) {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(tc.want)
			t.Errorf("%s:\n got %s\nwant %s", tc.name, g, w)
		}
	}
	if shared.JobID != "j0" {
		t.Errorf("Conclude changed the shared result: %+v", shared)
	}
}

// Finish stores the result in RESULTS with its hints, once; an announced
// one is published on the result subject and not stored; an answer too
// large to store ends failed, TooLarge.
func TestFinish(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{ResultMsgBytes: 4096})
	j := &task.Task{Job: job.Job{ID: job.NewID(), Tenant: "acme", Provider: "p"}, Model: "m", SubmittedAt: time.Now().UTC()}
	opKey, _ := mesh.OpKey("acme", "", j.ID)
	r, err := m.Finish(ctx, j, mesh.Outcome{Status: job.StatusFailed, Error: &job.Error{Code: "x"}},
		mesh.Exit{OpKey: opKey, Hints: mesh.ResultHints{RecordRev: 3, Facts: &mesh.JobFacts{Priority: job.Batch}}})
	if err != nil || r.CompletedAt.IsZero() || r.Model != "m" {
		t.Fatalf("Finish = %+v, %v; want a result completed now for model m", r, err)
	}
	if _, err := m.Finish(ctx, j, mesh.Outcome{Status: job.StatusSucceeded}, mesh.Exit{}); err != nil {
		t.Fatalf("a second result: %v, want nil (the first stands)", err)
	}
	st, err := m.JS.Stream(ctx, streams.Results)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := st.GetLastMsgForSubject(ctx, job.StoreSubject("acme", j.ID))
	if err != nil {
		t.Fatal(err)
	}
	var stored job.Result
	if err := json.Unmarshal(msg.Data, &stored); err != nil || stored.Status != job.StatusFailed || stored.Provider != "p" {
		t.Fatalf("stored %s (%v); want the first, failed, result", msg.Data, err)
	}
	h := mesh.Hints(msg.Header)
	if msg.Header.Get(mesh.OpKeyHeader) != opKey || h.RecordRev != 3 || h.Facts == nil || h.Facts.Priority != job.Batch {
		t.Errorf("hints %+v, op key %q; want record rev 3, batch facts, %q", h, msg.Header.Get(mesh.OpKeyHeader), opKey)
	}

	// Announced: on the result subject, not in RESULTS.
	a := &task.Task{Job: job.Job{ID: job.NewID(), Tenant: "acme"}}
	sub, err := m.JS.Conn().SubscribeSync(job.ResultSubject("acme", a.ID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Finish(ctx, a, mesh.Outcome{Status: job.StatusFailed}, mesh.Exit{Announce: true}); err != nil {
		t.Fatal(err)
	}
	if got, err := sub.NextMsg(10 * time.Second); err != nil || !strings.Contains(string(got.Data), a.ID) {
		t.Fatalf("announced: %v, %v", got, err)
	}
	if _, err := st.GetLastMsgForSubject(ctx, job.StoreSubject("acme", a.ID)); err == nil {
		t.Error("an announced result was stored")
	}

	// Too large to store: failed with TooLarge, stored without the answer.
	big := &task.Task{Job: job.Job{ID: job.NewID(), Tenant: "acme"}}
	body, _ := json.Marshal(strings.Repeat("x", 8192))
	tooLarge := &job.Error{Code: job.CodeResponseTooLarge}
	r, err = m.Finish(ctx, big, mesh.Outcome{Status: job.StatusSucceeded, Response: body}, mesh.Exit{TooLarge: tooLarge})
	if err != nil || r.Status != job.StatusFailed || r.Error != tooLarge || r.Response != nil {
		t.Fatalf("too large: %+v, %v; want failed response_too_large", r, err)
	}
	if _, err := st.GetLastMsgForSubject(ctx, job.StoreSubject("acme", big.ID)); err != nil {
		t.Errorf("too large: nothing stored: %v", err)
	}
}
