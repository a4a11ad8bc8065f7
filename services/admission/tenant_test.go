package admission_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/streams"
)

// queueServer is an embedded server with Sluice's streams, and a
// configuration with one model p/m (budget to spare) and tenant t as given.
func queueServer(ctx context.Context, t *testing.T, tenant string) (*nats.Conn, jetstream.JetStream, *config.Config) {
	t.Helper()
	js := meshtest.JetStream(t, streams.Options{})
	cfg, err := config.Parse([]byte(`
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: m, rpm: 100000, tpm: 100000000}]
tenants: [` + tenant + `]
`))
	if err != nil {
		t.Fatal(err)
	}
	return js.Conn(), js, cfg
}

// TestTenantBudgetSharedByTwoProcesses: two admission services take the
// same QUEUE and keep local blocks of one tenant's per-minute budget; over
// the minute they dispatch exactly the tenant's rpm, no more and no less.
func TestTenantBudgetSharedByTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("blocks watched for seconds, about 7 s: the full tier runs it, not -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js, cfg := queueServer(ctx, t, "{name: t, rpm: 25}")
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	for range 2 {
		m := meshtest.Open(t, js)
		svc, err := admission.New(admission.Config{App: cfg}, m, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
		if err != nil {
			t.Fatal(err)
		}
		go func() { done <- svc.Run(runCtx) }()
	}
	defer func() {
		stop()
		<-done
		<-done
	}()
	// 80 jobs, in bursts of 10 every 300 ms, so both processes hold jobs
	// and blocks.
	start := time.Now()
	for i := range 80 {
		natstest.Pace(ctx, start, i/10, 300*time.Millisecond)
		if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, "t"), queued(i)); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, streams.Dispatch)
	if err != nil {
		t.Fatal(err)
	}
	dispatched := func() uint64 {
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		if n := dispatched(); n < 25 {
			return fmt.Errorf("two processes dispatched %d of tenant t's jobs, want its rpm, 25", n)
		}
		return nil
	})
	// Blocks come and go for a few more seconds; none may exceed the rpm.
	// Proving that nothing more is dispatched needs a time: both processes
	// keep asking for budget (blocks are given back and taken again), and
	// no event marks the last time they ask within the minute.
	time.Sleep(4 * time.Second)
	if n := dispatched(); n != 25 {
		t.Errorf("two processes dispatched %d of tenant t's jobs within the minute, want its rpm, 25", n)
	}
}

// TestUnconfirmedDispatch: DISPATCH's acknowledgement never comes (here
// the stream is gone and something else swallows its subject, as when a
// leader is lost with the message or a route is cut without a close).
// Admission must neither stop nor lose the job: after its ack wait the job
// goes back to QUEUE, and once DISPATCH is back it is dispatched.
func TestUnconfirmedDispatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, swallowed, sink := dispatchSwallowed(ctx, t, 300*time.Millisecond, false)
	// Admission gave up on the acknowledgement and put the job back: it is
	// dispatched again (and swallowed again). Then DISPATCH is back: the
	// job lands there.
	dispatchBack(ctx, t, js, swallowed, sink, 1,
		"admission never dispatched the job again: it waits for an acknowledgement that will not come",
		"the job never reached DISPATCH once it was back")
}

// dispatchBack waits for sends more dispatches to reach the sink (else
// fails with stopped), then brings DISPATCH back and waits for the job to
// land there once (else fails with notLanded).
func dispatchBack(ctx context.Context, t *testing.T, js jetstream.JetStream, reached chan struct{}, sink *nats.Subscription, sends int, stopped, notLanded string) {
	t.Helper()
	for range sends {
		select {
		case <-reached:
		case <-ctx.Done():
			t.Fatal(stopped)
		}
	}
	if err := sink.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	waitDispatched(ctx, t, js, notLanded)
}

// TestUnconfirmedDispatchSentAgain: a dispatch DISPATCH dropped (a stream
// with no leader answers nothing) is sent again, with its message id,
// while admission waits for the acknowledgement, so the stream takes it as
// soon as it is back, not an ack wait later.
func TestUnconfirmedDispatchSentAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// An ack wait longer than the test: only a copy sent while waiting can
	// reach DISPATCH in time.
	js, _, _ := dispatchSwallowed(ctx, t, time.Minute, false)
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	// One copy (waitDispatched counts them), whatever the number sent.
	waitDispatched(ctx, t, js, "the job never reached DISPATCH: its dispatch was not sent again while unconfirmed")
}

// TestDispatchKeptThroughElection: DISPATCH without a leader refuses each
// publish at once (no responders: the 503 a server answers when no stream
// takes the subject). Admission keeps the job, its reservation and its
// QUEUE message and sends the dispatch again while its ack wait lasts,
// rather than putting the job back on a QUEUE that may be electing too
// (a lost NAK is QUEUE's 30 s ack wait) and reserving it again.
func TestDispatchKeptThroughElection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, refused, sink := dispatchSwallowed(ctx, t, time.Minute, true)
	// One send and nats.go's own two retries make three refusals; wait
	// for admission's own sends after them.
	dispatchBack(ctx, t, js, refused, sink, 6, "admission stopped sending the dispatch DISPATCH refused",
		"the job never reached DISPATCH once it had a leader")
	cons, err := js.Consumer(ctx, streams.Queue, keys.AdmissionConsumer("t"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || info.Delivered.Consumer != 1 {
		t.Fatalf("QUEUE delivered the job %d times (%d redelivered); want once: admission put it back instead of keeping it", info.Delivered.Consumer, info.NumRedelivered)
	}
}

// dispatchSwallowed runs admission (with ackWait) where DISPATCH is gone
// and a subscriber takes its subject, queues one job and returns once its
// dispatch reached the subscriber; swallowed tells of each later one. The
// subscriber answers nothing, or, with noLeader, what a server answers a
// publish no stream takes (503, no responders).
func dispatchSwallowed(ctx context.Context, t *testing.T, ackWait time.Duration, noLeader bool) (js jetstream.JetStream, swallowed chan struct{}, sink *nats.Subscription) {
	t.Helper()
	nc, js, cfg := queueServer(ctx, t, "{name: t}")
	if err := js.DeleteStream(ctx, streams.Dispatch); err != nil {
		t.Fatal(err)
	}
	swallowed = make(chan struct{}, 16)
	sink, err := nc.Subscribe("sluice.dispatch.>", func(m *nats.Msg) {
		if noLeader {
			_ = m.RespondMsg(&nats.Msg{Header: nats.Header{"Status": []string{"503"}}})
		}
		select {
		case swallowed <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(runAdmission(ctx, t, admission.Config{App: cfg, AckWait: ackWait}, meshtest.Open(t, js)))
	if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, "t"), queued(1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-swallowed:
	case <-ctx.Done():
		t.Fatal("admission never dispatched the job")
	}
	return js, swallowed, sink
}

// TestLetsGoWithoutBudgetStore: an admission process whose budget store
// fails (here its handle names a bucket that is gone; in life, its node
// cut off or its connection broken) must not hold jobs for as long as it
// lives: after its LetGoAfter it sends them back, and a process that can
// reserve dispatches them.
func TestLetsGoWithoutBudgetStore(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, js, cfg := queueServer(ctx, t, "{name: t}")
	healthy := meshtest.Open(t, js)
	key, err := guard.LoadKey(ctx, healthy.Fleet)
	if err != nil {
		t.Fatal(err)
	}
	sick := meshtest.Open(t, js)
	if sick.Budgets, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "gone"}); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	start := func(m *mesh.Mesh) func() {
		return runAdmission(ctx, t, admission.Config{App: cfg, Guard: guard.New(cfg, key), LetGoAfter: time.Second}, m)
	}
	defer start(sick)()
	if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, "t"), queued(1)); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("00000000-0000-7000-8000-%012d", 1)
	// The sick process takes it and cannot reserve.
	natstest.Eventually(t, 30*time.Second, func() error {
		if m, err := nc.Request(mesh.WhySubject("t", id), nil, time.Second); err != nil || !strings.Contains(string(m.Data), "budget_store") {
			return fmt.Errorf("the sick process does not hold the job (%v)", err)
		}
		return nil
	})
	defer start(healthy)()
	waitDispatched(ctx, t, js, "the job never reached DISPATCH: the process that cannot reach its budget store kept it")
}

// runAdmission runs an admission service on m until the returned stop is
// called.
func runAdmission(ctx context.Context, t *testing.T, cfg admission.Config, m *mesh.Mesh) (stop func()) {
	t.Helper()
	svc, err := admission.New(cfg, m, slog.New(slog.DiscardHandler), metrics.New(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	return func() {
		cancel()
		<-done
	}
}

// waitDispatched waits until DISPATCH holds one job; failing says why.
func waitDispatched(ctx context.Context, t *testing.T, js jetstream.JetStream, failing string) {
	t.Helper()
	st, err := js.Stream(ctx, streams.Dispatch)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		info, err := st.Info(ctx)
		if err == nil && info.State.Msgs != 1 {
			err = fmt.Errorf("DISPATCH holds %d jobs", info.State.Msgs)
		}
		if err != nil {
			return fmt.Errorf("%s (last: %w)", failing, err)
		}
		return nil
	})
}

// TestHeldJobGivenBack: a model's held job that is not dispatched within
// HeldMax (here its budget does not free for a minute; in life, whatever
// the store did meanwhile) goes back to QUEUE, where any admission
// process takes it again, instead of waiting in one process for as long
// as that process lives.
func TestHeldJobGivenBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m := meshtest.New(t, streams.Options{})
	js := m.JS
	cfg, err := config.Parse([]byte(`
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    models: [{name: m, rpm: 1, tpm: 100000000, adaptive: false}]
tenants: [{name: t}]
`))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	svc, err := admission.New(admission.Config{App: cfg, HeldMax: time.Second}, m, slog.New(slog.DiscardHandler), metrics.New(reg))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()
	for i := range 2 {
		if _, err := js.Publish(ctx, job.QueueSubject(job.Standard, "t"), queued(i)); err != nil {
			t.Fatal(err)
		}
	}
	// One request a minute: the first is dispatched, the second waits.
	waitDispatched(ctx, t, js, "the first job was never dispatched")
	cons, err := js.Consumer(ctx, streams.Queue, keys.AdmissionConsumer("t"))
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 15*time.Second, func() error {
		info, err := cons.Info(ctx)
		if err == nil && info.NumRedelivered == 0 {
			err = errors.New("the held job was not given back to QUEUE")
		}
		return err
	})
	var oldest float64
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "sluice_held_oldest_seconds" {
			oldest = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if oldest > 4 {
		t.Errorf("sluice_held_oldest_seconds = %v, want at most HeldMax and its check interval", oldest)
	}
}
