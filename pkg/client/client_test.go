package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/natstest"
	"github.com/sluice-dev/sluice/streams"
)

func setup(t *testing.T) (*client.Client, jetstream.JetStream) {
	t.Helper()
	s := natstest.Server(t)
	nc := natstest.Conn(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return c, js
}

func TestSubmitAssignsIDAndPublishesToIntake(t *testing.T) {
	t.Parallel()
	c, js := setup(t)
	ctx := context.Background()
	j := &job.Job{Tenant: "acme", Request: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)}
	id, err := c.Submit(ctx, j)
	if err != nil {
		t.Fatal(err)
	}
	if id == "" || id != j.ID {
		t.Fatalf("Submit returned id %q, job has %q", id, j.ID)
	}
	// Submitting the same job again is deduplicated by the stream.
	if _, err := c.Submit(ctx, j); err != nil {
		t.Fatal(err)
	}
	st, _ := js.Stream(ctx, streams.Intake)
	info, _ := st.Info(ctx)
	if info.State.Msgs != 1 {
		t.Errorf("INTAKE holds %d messages, want 1 (the repeat is a duplicate)", info.State.Msgs)
	}
	m, err := st.GetLastMsgForSubject(ctx, job.IntakeSubject("acme"))
	if err != nil {
		t.Fatal(err)
	}
	var got job.Job
	if err := json.Unmarshal(m.Data, &got); err != nil || got.ID != id {
		t.Errorf("intake message %s decodes to id %q (%v), want %q", m.Data, got.ID, err, id)
	}
	if _, err := c.Submit(ctx, &job.Job{Tenant: "not.valid"}); err == nil {
		t.Error("Submit accepted a tenant that is not one subject token")
	}
}

func TestQueueFullIsTyped(t *testing.T) {
	t.Parallel()
	c, js := setup(t)
	ctx := context.Background()
	// A tiny intake so the test fills it quickly.
	if err := js.DeleteStream(ctx, streams.Intake); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: streams.Intake, Subjects: []string{"sluice.intake.>"},
		Retention: jetstream.WorkQueuePolicy, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true, MaxMsgsPerSubject: 3}); err != nil {
		t.Fatal(err)
	}
	var err error
	for i := 0; i < 4 && err == nil; i++ {
		_, err = c.Submit(ctx, &job.Job{Tenant: "acme", Request: []byte(`{}`)})
	}
	if !errors.Is(err, client.ErrQueueFull) {
		t.Fatalf("4th submit into a 3-message intake: got %v, want ErrQueueFull", err)
	}
	var qf *client.QueueFullError
	if !errors.As(err, &qf) || qf.RetryAfter <= 0 {
		t.Errorf("got %#v, want a QueueFullError with a retry hint", err)
	}
}

func TestAwaitFindsStoredAndLaterResults(t *testing.T) {
	t.Parallel()
	c, js := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, streams.BucketResults)
	if err != nil {
		t.Fatal(err)
	}
	// Already stored before Await.
	stored, _ := json.Marshal(map[string]any{"result": job.Result{JobID: "a", Tenant: "acme", Status: job.StatusSucceeded}})
	if _, err := kv.Put(ctx, "a", stored); err != nil {
		t.Fatal(err)
	}
	r, err := c.Await(ctx, "acme", "a")
	if err != nil || r.Status != job.StatusSucceeded {
		t.Fatalf("Await(stored) = %+v, %v", r, err)
	}
	// Published while Await waits.
	go func() {
		time.Sleep(100 * time.Millisecond)
		data, _ := json.Marshal(job.Result{JobID: "b", Tenant: "acme", Status: job.StatusFailed})
		_, _ = js.Publish(ctx, job.StoreSubject("acme", "b"), data)
	}()
	r, err = c.Await(ctx, "acme", "b")
	if err != nil || r.Status != job.StatusFailed || r.JobID != "b" {
		t.Fatalf("Await(later) = %+v, %v", r, err)
	}
}
