package dlq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type fixture struct {
	ctx context.Context
	js  jetstream.JetStream
}

func setup(t *testing.T) fixture {
	t.Helper()
	js := meshtest.JetStream(t, streams.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return fixture{ctx: ctx, js: js}
}

// entry is a dead letter of a job that used up its retries.
func entry(tenant string) *dlq.Entry {
	deadline := time.Now().Add(-time.Hour).UTC()
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	return &dlq.Entry{
		Job: task.Task{
			Job:         job.Job{ID: job.NewID(), Tenant: tenant, Priority: job.Batch, IdempotencyKey: "op-" + tenant, Deadline: &deadline, Request: json.RawMessage(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`), Task: "summarise", Endpoint: job.EndpointChat, Cost: map[string]int{"images": 2}, AtLeastOnce: true, Provider: "openai", Cache: &job.CacheOptions{TTL: 60}, Affinity: "conversation-1"},
			SubmittedAt: at.Add(-time.Minute),
			Model:       "gpt-4o-mini",
			Estimate:    &job.Estimate{PromptTokens: 9, MaxTokens: 256},
			NotBefore:   &at,
			Reservation: &task.Reservation{ID: "r1", Requests: 1, Tokens: 265, ReservedAt: at, ValidUntil: at.Add(time.Second)},
			Attempts: []job.Attempt{
				{N: 1, Provider: "openai", Model: "gpt-4o-mini", StartedAt: at, Status: 503, Outcome: "retry"},
				{N: 2, Provider: "openai", Model: "gpt-4o-mini", StartedAt: at.Add(time.Second), Status: 503, Outcome: "dead_lettered"},
			},
			RateLimited: 2,
			Seal:        "c2VhbA",
			Revs:        &task.Revs{Record: 7, Op: 8},
			Gated:       true,
			CacheTarget: &task.CacheTarget{Key: "t." + tenant + ".chat.abc", TTL: time.Minute},
			Pinned:      true,
			Requeued:    &task.Requeued{Reason: "lapsed", N: 1},
			SpendHold:   &task.SpendHold{Amount: 5, Day: "2026-12-03"},
			WaitReason:  "tenant_rpm",
			NoLane:      true,
		},
		Reason:    dlq.ReasonRetriesExhausted,
		LastError: &job.Error{Code: "server_is_overloaded", Message: "try again later"},
	}
}

func (f fixture) publish(t *testing.T, es ...*dlq.Entry) {
	t.Helper()
	for _, e := range es {
		if err := dlq.Publish(f.ctx, f.js, e); err != nil {
			t.Fatal(err)
		}
	}
}

func ids(ls []dlq.Listed) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Job.ID)
	}
	return out
}

func TestPublishListGet(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a1, b1, a2 := entry("acme"), entry("globex"), entry("acme")
	f.publish(t, a1, b1, a2)
	if a1.DeadAt.IsZero() {
		t.Error("Publish left DeadAt zero")
	}

	for _, tc := range []struct {
		name   string
		filter dlq.Filter
		want   []string
	}{
		{"all", dlq.Filter{}, []string{a1.Job.ID, b1.Job.ID, a2.Job.ID}},
		{"tenant", dlq.Filter{Tenant: "acme"}, []string{a1.Job.ID, a2.Job.ID}},
		{"other tenant", dlq.Filter{Tenant: "globex"}, []string{b1.Job.ID}},
		{"no such tenant", dlq.Filter{Tenant: "initech"}, nil},
		{"newest", dlq.Filter{Limit: 2}, []string{b1.Job.ID, a2.Job.ID}},
		{"tenant newest", dlq.Filter{Tenant: "acme", Limit: 1}, []string{a2.Job.ID}},
		{"limit above count", dlq.Filter{Limit: 10}, []string{a1.Job.ID, b1.Job.ID, a2.Job.ID}},
	} {
		got, err := dlq.List(f.ctx, f.js, tc.filter)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(ids(got), tc.want) {
			t.Errorf("%s: List(%+v) = %v, want %v", tc.name, tc.filter, ids(got), tc.want)
		}
	}

	got, err := dlq.Get(f.ctx, f.js, "", b1.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Seq != 2 || got.Reason != dlq.ReasonRetriesExhausted || got.Job.Tenant != "globex" ||
		len(got.Job.Attempts) != 2 || got.LastError == nil || got.LastError.Code != "server_is_overloaded" ||
		!got.DeadAt.Equal(b1.DeadAt) || string(got.Job.Request) != string(b1.Job.Request) {
		t.Errorf("Get = %+v, want the published entry at seq 2", got)
	}

	// Reading removed nothing.
	all, err := dlq.List(f.ctx, f.js, dlq.Filter{})
	if err != nil || len(all) != 3 {
		t.Errorf("after reads: %d entries, %v; want 3", len(all), err)
	}
}

func TestListEmpty(t *testing.T) {
	t.Parallel()
	f := setup(t)
	got, err := dlq.List(f.ctx, f.js, dlq.Filter{})
	if err != nil || len(got) != 0 {
		t.Errorf("List on an empty DLQ = %v, %v; want none", got, err)
	}
	if _, err := dlq.List(f.ctx, f.js, dlq.Filter{Tenant: "a.b"}); err == nil {
		t.Error("List with tenant a.b: no error")
	}
}

func TestGetUnknown(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.publish(t, entry("acme"))
	for _, id := range []string{job.NewID(), "*", ">", "a.b", ""} {
		_, err := dlq.Get(f.ctx, f.js, "", id)
		if !errors.Is(err, job.ErrNotFound) {
			t.Errorf("Get(%q) = %v, want job.ErrNotFound", id, err)
		}
	}
}

func TestPublishIdempotent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	e := entry("acme")
	f.publish(t, e)
	again := *e
	again.Reason = dlq.ReasonMaxDeliveries
	f.publish(t, &again)
	got, err := dlq.List(f.ctx, f.js, dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Reason != dlq.ReasonRetriesExhausted {
		t.Errorf("after publishing twice: %+v, want the first entry only", got)
	}
}

func TestPublishInvalid(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, tc := range []struct {
		name string
		mod  func(*dlq.Entry)
	}{
		{"no id", func(e *dlq.Entry) { e.Job.ID = "" }},
		{"wildcard id", func(e *dlq.Entry) { e.Job.ID = "*" }},
		{"bad tenant", func(e *dlq.Entry) { e.Job.Tenant = "a.b" }},
		{"no reason", func(e *dlq.Entry) { e.Reason = "" }},
	} {
		e := entry("acme")
		tc.mod(e)
		if err := dlq.Publish(f.ctx, f.js, e); err == nil {
			t.Errorf("%s: Publish succeeded, want an error", tc.name)
		}
	}
}

// intake reads the messages waiting on INTAKE for tenant, without consuming them.
func (f fixture) intake(t *testing.T, tenant string) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := f.js.Stream(f.ctx, streams.Intake)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := uint64(1); ; {
		m, err := s.GetMsg(f.ctx, seq, jetstream.WithGetMsgSubject(job.IntakeSubject(tenant)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
}

func TestReplayByID(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, b := entry("acme"), entry("acme")
	f.publish(t, a, b)

	var calls [][2]int
	rep, err := dlq.Replay(f.ctx, f.js, []string{a.Job.ID, a.Job.ID}, "", func(done, total int) { calls = append(calls, [2]int{done, total}) })
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Replayed) != 1 || len(rep.Failed) != 0 || rep.Replayed[0].Original != a.Job.ID || rep.Replayed[0].New == "" || rep.Replayed[0].New == a.Job.ID {
		t.Fatalf("report = %+v, want one new job for %s", rep, a.Job.ID)
	}
	if want := [][2]int{{1, 1}}; !slices.Equal(calls, want) {
		t.Errorf("progress calls = %v, want %v", calls, want)
	}

	msgs := f.intake(t, "acme")
	if len(msgs) != 1 {
		t.Fatalf("INTAKE holds %d messages for acme, want 1", len(msgs))
	}
	m := msgs[0]
	if got := m.Header.Get(dlq.HeaderReplayOf); got != a.Job.ID {
		t.Errorf("%s = %q, want %q", dlq.HeaderReplayOf, got, a.Job.ID)
	}
	if got, want := m.Header.Get(jetstream.MsgIDHeader), "replay:acme."+a.Job.ID+":1:"; !strings.HasPrefix(got, want) || len(got) != len(want)+24 {
		t.Errorf("message id = %q, want %q and a digest of the entry", got, want)
	}
	nj, err := job.Decode(m.Data, job.DefaultLimits)
	if err != nil {
		t.Fatalf("intake message does not decode as a job: %v", err)
	}
	if nj.ID != rep.Replayed[0].New || nj.Tenant != "acme" || nj.Priority != job.Batch || nj.Task != "summarise" ||
		nj.Endpoint != a.Job.Endpoint || string(nj.Request) != string(a.Job.Request) || !reflect.DeepEqual(nj.Cost, a.Job.Cost) {
		t.Errorf("replayed job = %+v, want a fresh job with the original's tenant, priority, task, endpoint, request and cost", nj)
	}
	// Every other field starts empty: the deadline and idempotency key on
	// purpose, the rest because Sluice fills them in.
	// The message is read as the mesh would read it, with every member
	// Sluice sets.
	var replayed task.Task
	if err := json.Unmarshal(m.Data, &replayed); err != nil {
		t.Fatal(err)
	}
	kept := map[string]bool{"Job": true, "ID": true, "Tenant": true, "Priority": true, "Task": true, "Endpoint": true, "Request": true, "Cost": true, "AtLeastOnce": true, "Cache": true, "Affinity": true}
	for _, pair := range [][2]reflect.Value{{reflect.ValueOf(a.Job.Job), reflect.ValueOf(replayed.Job)}, {reflect.ValueOf(a.Job), reflect.ValueOf(replayed)}} {
		orig, got := pair[0], pair[1]
		for i := range orig.NumField() {
			name := orig.Type().Field(i).Name
			if orig.Field(i).IsZero() {
				t.Errorf("test entry leaves %s.%s empty: set it, and decide whether a replay keeps it", orig.Type(), name)
			}
			if !kept[name] && !got.Field(i).IsZero() {
				t.Errorf("replayed %s.%s = %v, want it empty", orig.Type(), name, got.Field(i).Interface())
			}
		}
	}

	if _, err := dlq.Get(f.ctx, f.js, "", a.Job.ID); !errors.Is(err, job.ErrNotFound) {
		t.Errorf("after replay, Get(original) = %v, want job.ErrNotFound", err)
	}
	left, err := dlq.List(f.ctx, f.js, dlq.Filter{})
	if err != nil || !slices.Equal(ids(left), []string{b.Job.ID}) {
		t.Errorf("DLQ after replay = %v, %v; want only %s", ids(left), err, b.Job.ID)
	}
}

func TestReplayByTenant(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a1, g1, a2 := entry("acme"), entry("globex"), entry("acme")
	f.publish(t, a1, g1, a2)

	rep, err := dlq.Replay(f.ctx, f.js, nil, "acme", nil)
	if err != nil {
		t.Fatal(err)
	}
	var orig []string
	for _, p := range rep.Replayed {
		orig = append(orig, p.Original)
	}
	if want := []string{a1.Job.ID, a2.Job.ID}; !slices.Equal(orig, want) || len(rep.Failed) != 0 {
		t.Errorf("replayed %v (failed %v), want %v", orig, rep.Failed, want)
	}
	msgs := f.intake(t, "acme")
	if len(msgs) != 2 {
		t.Fatalf("INTAKE holds %d messages for acme, want 2", len(msgs))
	}
	for i, m := range msgs {
		if got := m.Header.Get(dlq.HeaderReplayOf); got != orig[i] {
			t.Errorf("intake message %d replays %q, want %q", i, got, orig[i])
		}
	}
	if n := len(f.intake(t, "globex")); n != 0 {
		t.Errorf("INTAKE holds %d messages for globex, want 0", n)
	}
	left, err := dlq.List(f.ctx, f.js, dlq.Filter{})
	if err != nil || !slices.Equal(ids(left), []string{g1.Job.ID}) {
		t.Errorf("DLQ after replay = %v, %v; want only %s", ids(left), err, g1.Job.ID)
	}

	// With ids, the tenant guards them.
	if _, err := dlq.Replay(f.ctx, f.js, []string{g1.Job.ID}, "acme", nil); err == nil {
		t.Error("replaying a globex job as acme: no error")
	}

	// Everything that is left.
	rep, err = dlq.Replay(f.ctx, f.js, nil, "", nil)
	if err != nil || len(rep.Replayed) != 1 || rep.Replayed[0].Original != g1.Job.ID {
		t.Errorf("replay all = %+v, %v; want %s", rep, err, g1.Job.ID)
	}
	rep, err = dlq.Replay(f.ctx, f.js, nil, "", nil)
	if err != nil || len(rep.Replayed)+len(rep.Failed) != 0 {
		t.Errorf("replay of an empty DLQ = %+v, %v; want nothing", rep, err)
	}
}

func TestReplayUnknown(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := entry("acme")
	f.publish(t, a)
	unknown := job.NewID()
	rep, err := dlq.Replay(f.ctx, f.js, []string{a.Job.ID, unknown}, "", nil)
	if !errors.Is(err, job.ErrNotFound) {
		t.Fatalf("Replay with an unknown id = %v, want job.ErrNotFound", err)
	}
	if want := fmt.Sprintf("no dead-lettered job with id %s", unknown); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if len(rep.Replayed) != 0 {
		t.Errorf("replayed %v despite the unknown id", rep.Replayed)
	}
	if n := len(f.intake(t, "acme")); n != 0 {
		t.Errorf("INTAKE holds %d messages, want 0: nothing is replayed when an id is unknown", n)
	}
}

// A replay that published but did not delete (a crash in between) is not
// submitted twice when run again within INTAKE's duplicate window.
func TestReplayRerunDeduplicated(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := entry("acme")
	f.publish(t, a)
	l, err := dlq.Get(f.ctx, f.js, "", a.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := f.dlqStream(t).GetMsg(f.ctx, l.Seq)
	if err != nil {
		t.Fatal(err)
	}
	// What the first run published before it stopped.
	earlier := nats.NewMsg(job.IntakeSubject("acme"))
	earlier.Data = []byte(`{"tenant":"acme"}`)
	earlier.Header.Set(jetstream.MsgIDHeader, keys.ReplayMsgID("acme", a.Job.ID, l.Seq, stored.Data))
	if _, err := f.js.PublishMsg(f.ctx, earlier); err != nil {
		t.Fatal(err)
	}

	rep, err := dlq.Replay(f.ctx, f.js, []string{a.Job.ID}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []dlq.Pair{{Tenant: "acme", Original: a.Job.ID, Duplicate: true}}; !slices.Equal(rep.Replayed, want) {
		t.Errorf("rerun replayed %+v, want %+v", rep.Replayed, want)
	}
	if n := len(f.intake(t, "acme")); n != 1 {
		t.Errorf("INTAKE holds %d messages, want 1: the rerun must be deduplicated", n)
	}
	if _, err := dlq.Get(f.ctx, f.js, "", a.Job.ID); !errors.Is(err, job.ErrNotFound) {
		t.Errorf("after the rerun, Get(original) = %v, want job.ErrNotFound", err)
	}
}

// A replay INTAKE refuses leaves the job in the DLQ and says why.
func TestReplayIntakeFull(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, b := entry("acme"), entry("acme")
	f.publish(t, a, b)
	s, err := f.js.Stream(f.ctx, streams.Intake)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs = 1
	if _, err := f.js.UpdateStream(f.ctx, cfg); err != nil {
		t.Fatal(err)
	}

	rep, err := dlq.Replay(f.ctx, f.js, nil, "acme", nil)
	if err == nil || !strings.Contains(err.Error(), "1 of 2 jobs not replayed") || !strings.Contains(err.Error(), "intake is full") {
		t.Errorf("Replay into a full intake = %v, want \"1 of 2 jobs not replayed\" naming the full intake", err)
	}
	if len(rep.Replayed) != 1 || rep.Replayed[0].Original != a.Job.ID {
		t.Errorf("replayed %+v, want %s", rep.Replayed, a.Job.ID)
	}
	if len(rep.Failed) != 1 || rep.Failed[0].Original != b.Job.ID || rep.Failed[0].New != "" || rep.Failed[0].Error == "" {
		t.Errorf("failed %+v, want %s with its error", rep.Failed, b.Job.ID)
	}
	left, err := dlq.List(f.ctx, f.js, dlq.Filter{})
	if err != nil || !slices.Equal(ids(left), []string{b.Job.ID}) {
		t.Errorf("DLQ after a refused replay = %v, %v; want %s still there", ids(left), err, b.Job.ID)
	}
}

// TestFloodKeepsOtherTenants: one tenant's flood of dead letters (large
// requests, as a model the provider refuses makes free for the sender)
// trims that tenant's own oldest, never another tenant's entry, even when
// the flood is larger than the whole stream.
func TestFloodKeepsOtherTenants(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const keep = 3
	s, err := f.js.Stream(f.ctx, streams.DLQ)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxBytes = 64 << 10
	cfg.Metadata = map[string]string{"sluice_dead_letters_per_tenant": strconv.Itoa(keep)} // dlq.MetaPerTenant
	if _, err := f.js.UpdateStream(f.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	victim := entry("globex")
	victim.Reason = dlq.ReasonOutcomeUnknown
	f.publish(t, victim)

	big := json.RawMessage(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("x", 4<<10) + `"}]}`)
	var flood []string
	for range 60 { // 60 × 4 KiB: several times the stream
		e := entry("acme")
		e.Job.Request = big
		e.Reason = dlq.ReasonInvalid
		f.publish(t, e)
		flood = append(flood, e.Job.ID)
	}

	got, err := dlq.List(f.ctx, f.js, dlq.Filter{Tenant: "globex"})
	if err != nil {
		t.Fatal(err)
	}
	if ids := ids(got); !slices.Equal(ids, []string{victim.Job.ID}) {
		t.Fatalf("globex's dead letters after acme's flood: %v, want [%s]", ids, victim.Job.ID)
	}
	if _, err := dlq.Get(f.ctx, f.js, "globex", victim.Job.ID); err != nil {
		t.Fatalf("get globex's dead letter: %v", err)
	}
	acme, err := dlq.List(f.ctx, f.js, dlq.Filter{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(acme), flood[len(flood)-keep:]; !slices.Equal(got, want) {
		t.Fatalf("acme keeps %v, want its newest %d %v", got, keep, want)
	}
}

// TestPerTenantBoundInvalid: a bound that is not a positive integer is an
// error, not a silent default.
func TestPerTenantBoundInvalid(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s, err := f.js.Stream(f.ctx, streams.DLQ)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Metadata = map[string]string{"sluice_dead_letters_per_tenant": "0"}
	if _, err := f.js.UpdateStream(f.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := dlq.Publish(f.ctx, f.js, entry("acme")); err == nil || !strings.Contains(err.Error(), "sluice_dead_letters_per_tenant") {
		t.Fatalf("publish with bound 0: %v, want an error naming the key", err)
	}
}

func (f fixture) dlqStream(t *testing.T) jetstream.Stream {
	t.Helper()
	s, err := f.js.Stream(f.ctx, streams.DLQ)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestReplayForgedIDIgnored: another tenant publishing first, on its own
// intake subject, with the message id a replay of acme's dead letter would
// have had (the tenant, the job id and the DLQ sequence are all it can
// know) neither makes the replay report a duplicate nor loses the dead
// letter: the replay is submitted.
func TestReplayForgedIDIgnored(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := entry("acme")
	f.publish(t, a)
	l, err := dlq.Get(f.ctx, f.js, "acme", a.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	forged := nats.NewMsg(job.IntakeSubject("mallory"))
	forged.Data = []byte(`{"tenant":"mallory"}`)
	forged.Header.Set(jetstream.MsgIDHeader, "replay:acme."+a.Job.ID+":"+strconv.FormatUint(l.Seq, 10))
	if _, err := f.js.PublishMsg(f.ctx, forged); err != nil {
		t.Fatal(err)
	}
	rep, err := dlq.Replay(f.ctx, f.js, []string{a.Job.ID}, "acme", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Replayed) != 1 || rep.Replayed[0].Duplicate || rep.Replayed[0].New == "" {
		t.Fatalf("replay after mallory's forged id: %+v, want a new job for %s", rep.Replayed, a.Job.ID)
	}
	msgs := f.intake(t, "acme")
	if len(msgs) != 1 || msgs[0].Header.Get(dlq.HeaderReplayOf) != a.Job.ID {
		t.Fatalf("INTAKE holds %d messages of acme, want its replay", len(msgs))
	}
}
