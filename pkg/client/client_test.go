package client_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

func setup(t *testing.T) (*client.Client, jetstream.JetStream) {
	t.Helper()
	js := meshtest.JetStream(t, streams.Options{})
	c, err := client.New(js.Conn())
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
	// Submitting the same job again is deduplicated by the stream, and
	// the caller is told.
	var dup *client.DuplicateError
	if _, err := c.Submit(ctx, j); !errors.Is(err, client.ErrDuplicate) || !errors.As(err, &dup) || dup.ID != id {
		t.Fatalf("second Submit of the same job: got %v, want a DuplicateError for %s", err, id)
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

// fillIntake bounds INTAKE at 3 jobs per tenant and submits until refused.
func fillIntake(t *testing.T, c *client.Client, js jetstream.JetStream, tenant string) error {
	t.Helper()
	ctx := context.Background()
	if err := streams.Ensure(ctx, js, streams.Options{Intake: streams.Bounds{MaxMsgsPerSubject: 3}}); err != nil {
		t.Fatal(err)
	}
	var err error
	for i := 0; i < 4 && err == nil; i++ {
		_, err = c.Submit(ctx, &job.Job{Tenant: tenant, Request: []byte(`{"model":"m"}`)})
	}
	return err
}

func TestQueueFullIsTyped(t *testing.T) {
	t.Parallel()
	c, js := setup(t)
	// No ingest process answers: the default wait.
	start := time.Now()
	err := fillIntake(t, c, js, "acme")
	if !errors.Is(err, client.ErrQueueFull) {
		t.Fatalf("4th submit into a 3-message intake: got %v, want ErrQueueFull", err)
	}
	var qf *client.QueueFullError
	if !errors.As(err, &qf) || qf.RetryAfter != client.DefaultRetryAfter {
		t.Errorf("got %#v, want a QueueFullError with the default retry hint %s", err, client.DefaultRetryAfter)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("4 submits took %s with nobody to ask for a wait; want the refusal at once", d)
	}
}

// A refused Submit asks ingest (sluice.ingest.wait.<tenant>) how long to
// wait, with the refused job; without an answer in time it falls back.
func TestQueueFullCarriesSluicesWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		late bool // answered only after Submit has returned
		want time.Duration
	}{
		{"answered", false, 7300 * time.Millisecond},
		{"too late", true, client.DefaultRetryAfter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, js := setup(t)
			nc := js.Conn()
			asked := make(chan *nats.Msg, 10)
			answer := make(chan struct{})
			var answerOnce sync.Once
			answerNow := func() { answerOnce.Do(func() { close(answer) }) }
			defer answerNow()
			if !tc.late {
				answerNow()
			}
			sub, err := nc.Subscribe(job.WaitSubject("acme"), func(m *nats.Msg) {
				asked <- m
				<-answer
				_ = m.Respond([]byte(`{"retry_after_ms":7300}`))
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			// "too late" shows the wait for the hint is bounded: the answer
			// comes after the refusal, which carries the default.
			err = fillIntake(t, c, js, "acme")
			answerNow()
			var qf *client.QueueFullError
			if !errors.As(err, &qf) || qf.RetryAfter != tc.want {
				t.Fatalf("got %v, want a QueueFullError with RetryAfter %s", err, tc.want)
			}
			select {
			case m := <-asked:
				var j job.Job
				if err := json.Unmarshal(m.Data, &j); err != nil || j.Tenant != "acme" || string(j.Request) != `{"model":"m"}` {
					t.Errorf("the wait request carried %s (%v), want the refused job", m.Data, err)
				}
			default:
				t.Error("Submit did not ask for a wait")
			}
			// A second refusal within the hint's lifetime reuses an answer.
			if !tc.late {
				_, err := c.Submit(context.Background(), &job.Job{Tenant: "acme", Request: []byte(`{"model":"m"}`)})
				if !errors.As(err, &qf) || qf.RetryAfter != tc.want {
					t.Errorf("second refusal: got %v, want RetryAfter %s", err, tc.want)
				}
				if n := len(asked); n != 0 {
					t.Errorf("second refusal asked again (%d requests), want the answer reused", n)
				}
			}
		})
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
	a, b := job.NewID(), job.NewID()
	// Already stored before Await.
	stored, _ := json.Marshal(map[string]any{"tenant": "acme", "result": job.Result{JobID: a, Tenant: "acme", Status: job.StatusSucceeded}})
	if _, err := kv.Put(ctx, "acme."+a, stored); err != nil {
		t.Fatal(err)
	}
	r, err := c.Await(ctx, "acme", a)
	if err != nil || r.Status != job.StatusSucceeded {
		t.Fatalf("Await(stored) = %+v, %v", r, err)
	}
	// Published once Await has subscribed (the connection then holds one
	// more subscription), while it waits.
	nc := js.Conn()
	before := nc.NumSubscriptions()
	go func() {
		natstest.Poll(ctx, func() bool { return nc.NumSubscriptions() > before })
		data, _ := json.Marshal(job.Result{JobID: b, Tenant: "acme", Status: job.StatusFailed})
		_, _ = js.Publish(ctx, job.StoreSubject("acme", b), data)
	}()
	r, err = c.Await(ctx, "acme", b)
	if err != nil || r.Status != job.StatusFailed || r.JobID != b {
		t.Fatalf("Await(later) = %+v, %v", r, err)
	}
}

// TestTenantConnection: a connection with the tenant's inbox prefix (as
// TenantUser makes) never reads JetStream; Start subscribes before it
// submits, so the result published for the job reaches Wait.
func TestTenantConnection(t *testing.T) {
	t.Parallel()
	s := natstest.Server(t)
	admin := natstest.Conn(t, s)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.ClientURL(), nats.CustomInboxPrefix(client.InboxPrefix("acme")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lookup(ctx, "acme", job.NewID()); !errors.Is(err, client.ErrTenantConnection) {
		t.Errorf("Lookup on a tenant connection = %v, want ErrTenantConnection", err)
	}
	p, err := c.Start(ctx, &job.Job{Tenant: "acme", Request: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	want := job.Result{JobID: p.ID, Tenant: "acme", Status: job.StatusSucceeded}
	data, _ := json.Marshal(want)
	if err := admin.Publish(job.ResultSubject("acme", p.ID), data); err != nil {
		t.Fatal(err)
	}
	got, err := p.Wait(ctx)
	if err != nil || got.JobID != p.ID || got.Status != job.StatusSucceeded {
		t.Errorf("Wait = %+v, %v; want %+v", got, err, want)
	}
}

// Another tenant that knows (or guesses) a job id first, even one that
// copies this tenant's message id scheme, does not make this tenant's
// submission a duplicate.
func TestPredictedIDOfAnotherTenantIsNotADuplicate(t *testing.T) {
	t.Parallel()
	c, js := setup(t)
	ctx := context.Background()
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	id := "order-42"
	// The other tenant publishes first, with the id and the message id a
	// job of that id would have had under an id-only scheme, and under a
	// scheme of the tenant, the id and a digest of the envelope (which the
	// other tenant can know: a predictable id and body).
	envelope, _ := json.Marshal(&job.Job{ID: id, Tenant: "acme", Request: body})
	sum := sha256.Sum256(envelope)
	for _, msgID := range []string{"intake:" + id, "intake:acme:" + id, "intake:acme:" + id + ":" + hex.EncodeToString(sum[:12])} {
		m := nats.NewMsg(job.IntakeSubject("mallory"))
		m.Data, _ = json.Marshal(&job.Job{ID: id, Tenant: "mallory", Request: body})
		m.Header.Set(jetstream.MsgIDHeader, msgID)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Submit(ctx, &job.Job{ID: id, Tenant: "acme", Request: body}); err != nil {
		t.Fatalf("acme's submission of %s after mallory's: %v, want it accepted", id, err)
	}
	st, _ := js.Stream(ctx, streams.Intake)
	if _, err := st.GetLastMsgForSubject(ctx, job.IntakeSubject("acme")); err != nil {
		t.Errorf("INTAKE holds no job of acme: %v; want its submission stored", err)
	}
}
