package streams_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/pkg/natstest"
	"github.com/sluice-dev/sluice/streams"
)

func TestEnsureIsIdempotentAndResultsAreWriteOnce(t *testing.T) {
	t.Parallel()
	s := natstest.Server(t)
	nc := natstest.Conn(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; i < 2; i++ {
		if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
			t.Fatalf("ensure #%d: %v", i+1, err)
		}
	}
	for _, name := range []string{"INTAKE", "QUEUE", "DISPATCH", "RESULTS", "DLQ"} {
		if _, err := js.Stream(ctx, name); err != nil {
			t.Errorf("stream %s: %v", name, err)
		}
	}
	for _, c := range [][2]string{{"INTAKE", "ingest"}, {"QUEUE", "admission"}, {"RESULTS", "result"}} {
		if _, err := streams.EnsureConsumer(ctx, js, c[0], c[1], "", ""); err != nil {
			t.Error(err)
		}
	}

	// A result is republished to subscribers once; a second one for the same job is refused.
	sub, err := nc.SubscribeSync("sluice.result.acme.>")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "sluice.rstore.acme.job1", []byte(`{"n":1}`)); err != nil {
		t.Fatalf("first result: %v", err)
	}
	if _, err := js.Publish(ctx, "sluice.rstore.acme.job1", []byte(`{"n":2}`)); err == nil {
		t.Fatal("second result for the same job was stored; want refusal")
	}
	m, err := sub.NextMsg(2 * time.Second)
	if err != nil {
		t.Fatalf("republished result: %v", err)
	}
	if got, want := m.Subject, "sluice.result.acme.job1"; got != want {
		t.Errorf("republished subject = %q, want %q", got, want)
	}
	if _, err := sub.NextMsg(200 * time.Millisecond); err != nats.ErrTimeout {
		t.Errorf("second result reached subscribers: %v", err)
	}
}

// A per-tenant bound must refuse the new job, never drop an old one.
func TestBoundedStreamsRefuseNewPerSubject(t *testing.T) {
	t.Parallel()
	ss, err := streams.Streams()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ss {
		if c.Retention == jetstream.WorkQueuePolicy && c.Discard != jetstream.DiscardNew {
			t.Errorf("%s: a work queue must discard new (refuse), not old (lose jobs)", c.Name)
		}
		if c.Discard == jetstream.DiscardNew && c.MaxMsgsPerSubject > 0 && !c.DiscardNewPerSubject {
			t.Errorf("%s: max_msgs_per_subject without discard_new_per_subject drops the oldest message of a full subject", c.Name)
		}
	}
}
