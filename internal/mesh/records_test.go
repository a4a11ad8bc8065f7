package mesh_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// CreateRecords creates both records in one wait, and answers as
// KeyValue.Create does for a key that holds a record (ErrKeyExists) or only
// a withdrawal's marker (created anew).
func TestCreateRecords(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{})
	id := job.NewID()
	opKey, _ := mesh.OpKey("acme", "", id)

	rec, op := m.CreateRecords(ctx, "acme", id, []byte(`{"r":1}`), opKey, []byte(`{"o":1}`))
	if rec.Err != nil || op.Err != nil || rec.Rev == 0 || op.Rev == 0 {
		t.Fatalf("first create: %+v %+v; want both created", rec, op)
	}
	for _, c := range []struct {
		kv  jetstream.KeyValue
		key string
		rev uint64
		val string
	}{{m.Results, keys.Record("acme", id), rec.Rev, `{"r":1}`}, {m.Idempotency, opKey, op.Rev, `{"o":1}`}} {
		e, err := c.kv.Get(ctx, c.key)
		if err != nil || e.Revision() != c.rev || string(e.Value()) != c.val {
			t.Fatalf("%s/%s: %v, %v; want %s at %d", c.kv.Bucket(), c.key, e, err, c.val, c.rev)
		}
	}

	// Both exist: ErrKeyExists for each, nothing overwritten.
	rec2, op2 := m.CreateRecords(ctx, "acme", id, []byte(`{"r":2}`), opKey, []byte(`{"o":2}`))
	if !errors.Is(rec2.Err, jetstream.ErrKeyExists) || !errors.Is(op2.Err, jetstream.ErrKeyExists) {
		t.Fatalf("second create: %+v %+v; want ErrKeyExists for both", rec2, op2)
	}
	if e, _ := m.Results.Get(ctx, keys.Record("acme", id)); e == nil || string(e.Value()) != `{"r":1}` {
		t.Fatalf("job record overwritten: %v", e)
	}

	// The operation record withdrawn (purged, as ingest withdraws): it is
	// created anew; the job record still exists.
	if err := m.Idempotency.Purge(ctx, opKey, jetstream.LastRevision(op.Rev)); err != nil {
		t.Fatal(err)
	}
	rec3, op3 := m.CreateRecords(ctx, "acme", id, []byte(`{"r":3}`), opKey, []byte(`{"o":3}`))
	if !errors.Is(rec3.Err, jetstream.ErrKeyExists) || op3.Err != nil || op3.Rev <= op.Rev {
		t.Fatalf("after a withdrawal: %+v %+v; want the job record existing, the operation record made anew", rec3, op3)
	}
	if e, _ := m.Idempotency.Get(ctx, opKey); e == nil || string(e.Value()) != `{"o":3}` {
		t.Fatalf("operation record after re-create: %v", e)
	}
}

// A record whose publish reached a bucket that answers nothing (a leader
// lost; here the bucket is gone and a subscriber swallows its subject) is
// sent again while CreateRecords waits, so the bucket takes it once it is
// back, not an ack wait later (here a minute, past the test's deadline).
func TestCreateRecordsSentAgain(t *testing.T) {
	t.Parallel()
	recordsThroughGap(t, false, 1, 100*time.Millisecond)
}

// A record a bucket without a leader refuses at once (no responders, the
// 503 a server answers when no stream takes the subject; nats.go's own two
// retries refused too) is sent again while the wait lasts, not given up
// after half a second.
func TestCreateRecordsSentAgainAfterNoLeader(t *testing.T) {
	t.Parallel()
	// One publish and nats.go's two retries are three refusals, within
	// half a second, shorter than the resend interval; four more are
	// CreateRecords' own.
	recordsThroughGap(t, true, 7, mesh.ResendEvery)
}

// recordsThroughGap runs CreateRecords where the results bucket is gone
// and a subscriber takes its subjects (answering, with noLeader, a 503 as
// a server does for a subject no stream takes), brings the bucket back
// after sends copies reached the subscriber, and checks both records are
// created, the job record once. CreateRecords sends again every resend.
func recordsThroughGap(t *testing.T, noLeader bool, sends int, resend time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{})
	m.AckWait, m.ResendEvery = time.Minute, resend
	if err := m.JS.DeleteKeyValue(ctx, streams.BucketResults); err != nil {
		t.Fatal(err)
	}
	reached := make(chan struct{}, 64)
	sink, err := m.JS.Conn().Subscribe("$KV."+streams.BucketResults+".>", func(msg *nats.Msg) {
		if noLeader {
			_ = msg.RespondMsg(&nats.Msg{Header: nats.Header{"Status": []string{"503"}}})
		}
		select {
		case reached <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	id := job.NewID()
	opKey, _ := mesh.OpKey("acme", "", id)
	type both struct{ rec, op mesh.Created }
	got := make(chan both, 1)
	go func() {
		rec, op := m.CreateRecords(ctx, "acme", id, []byte(`{"r":1}`), opKey, []byte(`{"o":1}`))
		got <- both{rec, op}
	}()
	for i := range sends {
		select {
		case <-reached:
		case r := <-got:
			t.Fatalf("CreateRecords gave up after %d sends: %+v %+v", i, r.rec, r.op)
		case <-ctx.Done():
			t.Fatalf("the job record was published %d times, want %d", i, sends)
		}
	}
	if err := sink.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := streams.Ensure(ctx, m.JS, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	var r both
	select {
	case r = <-got:
	case <-ctx.Done():
		t.Fatal("CreateRecords still waits: the record was not sent again once the bucket was back")
	}
	if r.op.Err != nil || r.op.Rev == 0 {
		t.Fatalf("operation record %d (%v); want it created", r.op.Rev, r.op.Err)
	}
	storedOnce(ctx, t, m, id, r.rec)
}

// storedOnce checks that the job record id holds the one copy
// CreateRecords sent (some copies were sent several times): created at
// rec's revision, or ErrKeyExists when an earlier copy landed and a later
// one was refused (ingest then reads the record and finds its own job).
func storedOnce(ctx context.Context, t *testing.T, m *mesh.Mesh, id string, rec mesh.Created) {
	t.Helper()
	if rec.Err != nil && !errors.Is(rec.Err, jetstream.ErrKeyExists) || rec.Err == nil && rec.Rev == 0 {
		t.Fatalf("job record %d (%v); want it created", rec.Rev, rec.Err)
	}
	results, err := m.JS.KeyValue(ctx, streams.BucketResults)
	if err != nil {
		t.Fatal(err)
	}
	e, err := results.Get(ctx, keys.Record("acme", id))
	if err != nil || string(e.Value()) != `{"r":1}` || rec.Err == nil && e.Revision() != rec.Rev {
		t.Fatalf("job record: %v, %v; want {\"r\":1} (at %d if created)", e, err, rec.Rev)
	}
	st, err := m.JS.Stream(ctx, "KV_"+streams.BucketResults)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("the results bucket holds %d messages, want 1", n)
	}
}
