package streams_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natstest"
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

// The configuration's default bounds are the files' values.
func TestDefaultBoundsAreTheFiles(t *testing.T) {
	t.Parallel()
	ss, err := streams.Streams()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]config.StreamBounds{streams.Intake: config.DefaultIntakeBounds, streams.Queue: config.DefaultQueueBounds}
	for _, c := range ss {
		w, ok := want[c.Name]
		if !ok {
			continue
		}
		if got := (config.StreamBounds{MaxMsgs: c.MaxMsgs, MaxBytes: c.MaxBytes, MaxPerTenant: c.MaxMsgsPerSubject}); got != w {
			t.Errorf("%s: the file has %+v, the configuration's default is %+v", c.Name, got, w)
		}
		delete(want, c.Name)
	}
	if len(want) != 0 {
		t.Errorf("no stream file for %v", want)
	}
}

// Ensure applies configured bounds, and refuses to lower a per-subject
// bound below what a subject holds (JetStream would delete the oldest jobs).
func TestEnsureAppliesBounds(t *testing.T) {
	t.Parallel()
	s := natstest.Server(t)
	nc := natstest.Conn(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	small := streams.Options{
		ResultRetention: 3 * time.Hour, DLQRetention: 5 * time.Hour,
		Intake: streams.Bounds{MaxMsgs: 10, MaxBytes: 2 << 20, MaxMsgsPerSubject: 4},
		Queue:  streams.Bounds{MaxMsgs: 20, MaxBytes: 3 << 20, MaxMsgsPerSubject: 5},
	}
	if err := streams.Ensure(ctx, js, small); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]streams.Bounds{streams.Intake: small.Intake, streams.Queue: small.Queue} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c := st.CachedInfo().Config
		if got := (streams.Bounds{MaxMsgs: c.MaxMsgs, MaxBytes: c.MaxBytes, MaxMsgsPerSubject: c.MaxMsgsPerSubject}); got != want {
			t.Errorf("%s: got bounds %+v, want %+v", name, got, want)
		}
		if c.Discard != jetstream.DiscardNew || !c.DiscardNewPerSubject {
			t.Errorf("%s: discard %v per subject %v, want new and per subject", name, c.Discard, c.DiscardNewPerSubject)
		}
	}

	for name, want := range map[string]time.Duration{streams.Results: small.ResultRetention, streams.DLQ: small.DLQRetention} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CachedInfo().Config.MaxAge; got != want {
			t.Errorf("%s: max_age got %v, want %v", name, got, want)
		}
	}

	// Fill one tenant's intake: the fifth job is refused, none dropped.
	for i := range 5 {
		_, err := js.Publish(ctx, "sluice.intake.acme", []byte(`{}`))
		if i < 4 && err != nil {
			t.Fatalf("publish #%d: %v", i+1, err)
		}
		if i == 4 {
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10077 {
				t.Fatalf("publish #5 into a 4-per-tenant intake: got %v, want error 10077", err)
			}
		}
	}
	// Lowering the per-tenant bound below the 4 jobs held would delete the
	// oldest: refused.
	lower := small
	lower.Intake.MaxMsgsPerSubject = 2
	err = streams.Ensure(ctx, js, lower)
	if err == nil || !strings.Contains(err.Error(), "sluice.intake.acme") || !strings.Contains(err.Error(), "below the 4 messages") {
		t.Errorf("lowering max_msgs_per_subject under a full subject: got %v, want a refusal naming sluice.intake.acme", err)
	}
	// Lowering the stream-wide bound is safe (discard new keeps what is held).
	lower = small
	lower.Intake.MaxMsgs = 2
	if err := streams.Ensure(ctx, js, lower); err != nil {
		t.Fatalf("lowering max_msgs: %v", err)
	}
	st, _ := js.Stream(ctx, streams.Intake)
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 4 {
		t.Errorf("INTAKE holds %d messages after lowering its bounds, want the 4 it held", info.State.Msgs)
	}
}

// A job in INTAKE waits for room in QUEUE by redelivery; a delivery limit
// would strand it in INTAKE, an accepted job never processed.
func TestIntakeIsRedeliveredUntilItFits(t *testing.T) {
	t.Parallel()
	c, err := streams.Consumer(streams.Intake, "ingest")
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxDeliver != -1 {
		t.Errorf("INTAKE.ingest max_deliver: got %d, want -1 (unlimited)", c.MaxDeliver)
	}
}
