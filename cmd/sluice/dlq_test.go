package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/dlq"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// dlqPrompt is the prompt of every dead letter in these tests; the dlq
// commands must not print it unless asked.
const dlqPrompt = "summarise the secret merger memo"

type dlqFixture struct {
	ctx context.Context
	js  jetstream.JetStream
	url string
}

func dlqSetup(t *testing.T) dlqFixture {
	t.Helper()
	srv := natstest.Server(t)
	js, err := jetstream.New(natstest.Conn(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	return dlqFixture{ctx: ctx, js: js, url: srv.ClientURL()}
}

// dead publishes a dead letter for a new job of tenant and returns its id.
func (f dlqFixture) dead(t *testing.T, tenant, reason string) string {
	t.Helper()
	e := &dlq.Entry{
		Job: task.Task{
			Job:      job.Job{ID: job.NewID(), Tenant: tenant, Priority: job.Interactive, Request: dlqChatBody("gpt-4o-mini", dlqPrompt)},
			Attempts: []job.Attempt{{N: 1, Provider: "sim", Model: "gpt-4o-mini", Status: 401, Outcome: "failed"}},
		},
		Reason:    reason,
		LastError: &job.Error{Code: "invalid_api_key", Message: "Incorrect API key provided"},
		DeadAt:    time.Date(2025, 6, 7, 8, 9, 10, 0, time.UTC),
	}
	if err := dlq.Publish(f.ctx, f.js, e); err != nil {
		t.Fatal(err)
	}
	return e.Job.ID
}

func dlqChatBody(model, prompt string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, prompt))
}

// dlqRun runs `sluice dlq args...` against the fixture's server (through
// SLUICE_NATS_URL) and returns stdout, stderr and the error.
func (f dlqFixture) dlqRun(args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		if k == "SLUICE_NATS_URL" {
			return f.url
		}
		return ""
	}
	err := run(f.ctx, append([]string{"dlq"}, args...), getenv, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func (f dlqFixture) remaining(t *testing.T) []string {
	t.Helper()
	ls, err := dlq.List(f.ctx, f.js, dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range ls {
		ids = append(ids, l.Job.ID)
	}
	return ids
}

func TestDLQList(t *testing.T) {
	t.Parallel()
	f := dlqSetup(t)
	a1 := f.dead(t, "acme", dlq.ReasonAuth)
	g1 := f.dead(t, "globex", dlq.ReasonRetriesExhausted)
	a2 := f.dead(t, "acme", dlq.ReasonMaxDeliveries)

	out, _, err := f.dlqRun("list")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("list printed %d lines, want a header and 3 rows:\n%s", len(lines), out)
	}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "JOB ID TENANT REASON LAST ERROR ATTEMPTS DEAD-LETTERED AT" {
		t.Errorf("header = %q", lines[0])
	}
	for i, want := range [][]string{
		{a1, "acme", "auth", "invalid_api_key", "1", "2025-06-07T08:09:10Z"},
		{g1, "globex", "retries_exhausted", "invalid_api_key", "1", "2025-06-07T08:09:10Z"},
		{a2, "acme", "max_deliveries", "invalid_api_key", "1", "2025-06-07T08:09:10Z"},
	} {
		if got := strings.Fields(lines[i+1]); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("row %d = %q, want %q", i, got, want)
		}
	}
	if strings.Contains(out, dlqPrompt) {
		t.Error("list printed a prompt")
	}

	out, _, err = f.dlqRun("list", "--tenant", "acme", "--limit", "1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, a2) || strings.Contains(out, a1) || strings.Contains(out, g1) {
		t.Errorf("list --tenant acme --limit 1 = %q, want only %s", out, a2)
	}

	out, _, err = f.dlqRun("list", "--json", "--nats-url", f.url, "--tenant", "globex")
	if err != nil {
		t.Fatal(err)
	}
	var views []struct {
		Seq          uint64          `json:"seq"`
		Job          json.RawMessage `json:"job"`
		Reason       string          `json:"reason"`
		RequestBytes int             `json:"request_bytes"`
	}
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	if len(views) != 1 || views[0].Seq != 2 || views[0].Reason != "retries_exhausted" || views[0].RequestBytes == 0 {
		t.Errorf("list --json = %+v, want globex's entry at seq 2 with its request size", views)
	}
	if strings.Contains(out, dlqPrompt) {
		t.Error("list --json printed a prompt")
	}

	out, _, err = f.dlqRun("list", "--tenant", "initech")
	if err != nil || strings.TrimSpace(out) != "no dead-lettered jobs" {
		t.Errorf("list of an empty tenant = %q, %v", out, err)
	}
}

func TestDLQShow(t *testing.T) {
	t.Parallel()
	f := dlqSetup(t)
	id := f.dead(t, "acme", dlq.ReasonAuth)

	out, _, err := f.dlqRun("show", id)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Seq          uint64    `json:"seq"`
		Job          task.Task `json:"job"`
		Reason       string    `json:"reason"`
		LastError    *job.Error
		RequestBytes int `json:"request_bytes"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("show: %v\n%s", err, out)
	}
	want := len(dlqChatBody("gpt-4o-mini", dlqPrompt))
	if v.Job.ID != id || v.Reason != "auth" || v.RequestBytes != want || len(v.Job.Attempts) != 1 {
		t.Errorf("show = %+v, want job %s, reason auth, request_bytes %d", v, id, want)
	}
	if strings.Contains(out, dlqPrompt) {
		t.Errorf("show printed the prompt without --with-request:\n%s", out)
	}

	out, _, err = f.dlqRun("show", id, "--with-request")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, dlqPrompt) {
		t.Errorf("show --with-request left out the request:\n%s", out)
	}

	unknown := job.NewID()
	_, _, err = f.dlqRun("show", unknown)
	if err == nil || err.Error() != "no dead-lettered job with id "+unknown || !errors.Is(err, job.ErrNotFound) {
		t.Errorf("show of an unknown id = %v, want \"no dead-lettered job with id %s\"", err, unknown)
	}
	if _, _, err = f.dlqRun("show"); err == nil {
		t.Error("show without an id: no error")
	}
}

var dlqUUIDRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}`)

func TestDLQReplayByID(t *testing.T) {
	t.Parallel()
	f := dlqSetup(t)
	a := f.dead(t, "acme", dlq.ReasonAuth)
	b := f.dead(t, "acme", dlq.ReasonAuth)

	out, stderr, err := f.dlqRun("replay", a)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	m := regexp.MustCompile(`^replayed 1 job \(new ids: (\S+)\)\n$`).FindStringSubmatch(out)
	if m == nil || !dlqUUIDRE.MatchString(m[1]) || m[1] == a {
		t.Fatalf("replay printed %q, want \"replayed 1 job (new ids: <new uuid>)\"", out)
	}
	newID := m[1]
	if stderr != "" {
		t.Errorf("replay of one job wrote to stderr: %q", stderr)
	}

	s, err := f.js.Stream(f.ctx, streams.Intake)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetLastMsgForSubject(f.ctx, job.IntakeSubject("acme"))
	if err != nil {
		t.Fatal(err)
	}
	if got := msg.Header.Get(dlq.HeaderReplayOf); got != a {
		t.Errorf("intake %s = %q, want %q", dlq.HeaderReplayOf, got, a)
	}
	nj, err := job.Decode(msg.Data, job.DefaultLimits)
	if err != nil || nj.ID != newID || nj.Tenant != "acme" || nj.Priority != job.Interactive || nj.Deadline != nil {
		t.Errorf("intake job = %+v, %v; want %s for acme, interactive, no deadline", nj, err, newID)
	}
	if got := f.remaining(t); len(got) != 1 || got[0] != b {
		t.Errorf("DLQ after replay holds %v, want only %s", got, b)
	}

	unknown := job.NewID()
	_, _, err = f.dlqRun("replay", b, unknown)
	if err == nil || !strings.Contains(err.Error(), "no dead-lettered job with id "+unknown) {
		t.Errorf("replay with an unknown id = %v, want it named", err)
	}
	if got := f.remaining(t); len(got) != 1 {
		t.Errorf("DLQ holds %v after a refused replay, want %s still there", got, b)
	}

	if _, _, err := f.dlqRun("replay"); err == nil || !strings.Contains(err.Error(), "--all") {
		t.Errorf("replay with nothing selected = %v, want it to ask for ids, --tenant or --all", err)
	}
}

func TestDLQReplayByTenant(t *testing.T) {
	t.Parallel()
	f := dlqSetup(t)
	const n = dlqReplayBarMin + 5
	want := map[string]bool{}
	for range n {
		want[f.dead(t, "acme", dlq.ReasonRetriesExhausted)] = true
	}
	g := f.dead(t, "globex", dlq.ReasonRetriesExhausted)

	out, stderr, err := f.dlqRun("replay", "--tenant", "acme", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var rep dlq.ReplayReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("replay --json: %v\n%s", err, out)
	}
	if len(rep.Replayed) != n || len(rep.Failed) != 0 {
		t.Fatalf("replayed %d, failed %d; want %d, 0", len(rep.Replayed), len(rep.Failed), n)
	}
	for _, p := range rep.Replayed {
		if !want[p.Original] || !dlqUUIDRE.MatchString(p.New) {
			t.Errorf("pair %+v: want an acme original and a new UUIDv7", p)
		}
	}
	if !strings.Contains(stderr, "replaying") || !strings.Contains(stderr, fmt.Sprintf("(%d/%d", n, n)) {
		t.Errorf("no progress bar for %d jobs on stderr: %q", n, stderr)
	}
	if got := f.remaining(t); len(got) != 1 || got[0] != g {
		t.Errorf("DLQ after replaying acme holds %v, want only %s", got, g)
	}

	out, stderr, err = f.dlqRun("replay", "--all")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.HasPrefix(out, "replayed 1 job (new ids: ") || stderr != "" {
		t.Errorf("replay --all = %q (stderr %q), want one job and no bar", out, stderr)
	}
	if got := f.remaining(t); len(got) != 0 {
		t.Errorf("DLQ after replay --all holds %v", got)
	}
}

func TestDLQUsage(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	getenv := func(string) string { return "" }
	if err := run(context.Background(), []string{"dlq"}, getenv, &stdout, &stderr); err == nil || !strings.Contains(stderr.String(), "replay") {
		t.Errorf("dlq without a command = %v, usage %q", err, stderr.String())
	}
	if err := run(context.Background(), []string{"dlq", "purge"}, getenv, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "purge") {
		t.Errorf("dlq purge = %v, want an unknown command error", err)
	}
	stdout.Reset()
	if err := run(context.Background(), []string{"help"}, getenv, &stdout, &stderr); err != nil || !strings.Contains(stdout.String(), "dlq") {
		t.Errorf("help does not list dlq: %v\n%s", err, stdout.String())
	}
	// Neither help nor a refused connection prints credentials.
	withCreds := func(k string) string {
		if k == "SLUICE_NATS_URL" {
			return "nats://alice:hunter2@127.0.0.1:1"
		}
		return ""
	}
	for _, args := range [][]string{
		{"dlq", "list", "--nats-url", "nats://alice:hunter2@127.0.0.1:1"},
		{"dlq", "show", job.NewID()},
		{"dlq", "replay", "-h"},
	} {
		stdout.Reset()
		stderr.Reset()
		err := run(context.Background(), args, withCreds, &stdout, &stderr)
		all := fmt.Sprint(err) + stdout.String() + stderr.String()
		if strings.Contains(all, "hunter2") || strings.Contains(all, "alice") {
			t.Errorf("%q printed the NATS credentials: %s", args, all)
		}
	}
}

func TestDLQReplayPartial(t *testing.T) {
	t.Parallel()
	f := dlqSetup(t)
	a := f.dead(t, "acme", dlq.ReasonAuth)
	b := f.dead(t, "acme", dlq.ReasonAuth)
	s, err := f.js.Stream(f.ctx, streams.Intake)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs = 1 // room for one job
	if _, err := f.js.UpdateStream(f.ctx, cfg); err != nil {
		t.Fatal(err)
	}

	out, stderr, err := f.dlqRun("replay", a, b)
	if err == nil || !strings.Contains(err.Error(), "1 of 2 jobs not replayed") {
		t.Errorf("replay into a full intake = %v, want \"1 of 2 jobs not replayed\"", err)
	}
	if !strings.HasPrefix(out, "replayed 1 job (new ids: ") {
		t.Errorf("stdout = %q, want the one job replayed", out)
	}
	if !strings.Contains(stderr, "not replayed: replay "+b+": intake is full") {
		t.Errorf("stderr = %q, want %s named with the reason", stderr, b)
	}
	if got := f.remaining(t); len(got) != 1 || got[0] != b {
		t.Errorf("DLQ holds %v, want %s still there", got, b)
	}
}
