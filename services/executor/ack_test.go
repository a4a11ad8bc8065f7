package executor

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// recorded is a dispatched message that records how it was settled.
type recorded struct {
	dispatched
	data []byte
}

func (m *recorded) Data() []byte    { return m.data }
func (m *recorded) Subject() string { return "sluice.dispatch.p.m" }
func (m *recorded) Ack() error      { return m.note("ack") }
func (m *recorded) Term() error     { return m.note("term") }
func (m *recorded) NakWithDelay(d time.Duration) error {
	return m.note(fmt.Sprintf("nak %v", d))
}

func (m *recorded) note(s string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.settled = append(m.settled, s)
	return nil
}

func (m *recorded) got() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fmt.Sprint(m.settled)
}

func TestAcknowledge(t *testing.T) {
	t.Parallel()
	f := setup(t, answer(200, nil, okBody))
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "[ack]"},
		{errSettled, "[ack]"},
		{errTerminate, "[term]"},
		{fmt.Errorf("verify: %w", errTerminate), "[term]"},
		{redeliverAfter(90 * time.Second), "[nak 1m30s]"},
		{fmt.Errorf("lost call: %w", redeliverAfter(5*time.Second)), "[nak 5s]"},
		{errors.New("kv unavailable"), "[nak 1s]"},
	} {
		msg := &recorded{}
		f.s.acknowledge(msg, &task.Task{Job: job.Job{ID: "x"}}, tc.err)
		if got := msg.got(); got != tc.want {
			t.Errorf("acknowledge(%v) settled %s, want %s", tc.err, got, tc.want)
		}
	}
}

// TestHandlingSettlesOnce drives a dispatched message through the
// handling the consume loop runs and checks it is settled once, as its
// outcome says.
func TestHandlingSettlesOnce(t *testing.T) {
	t.Parallel()
	t.Run("undecodable", func(t *testing.T) {
		t.Parallel()
		f := setup(t, answer(200, nil, okBody))
		msg := &recorded{data: []byte("{not json")}
		mc := &modelCalls{s: f.s}
		h := mesh.Recover(f.s.log, "dispatch")(f.s.poison().Middleware(mc.take))
		mesh.Settle(msg, h(context.Background(), msg), f.s.log, "dispatch", "")
		if got := msg.got(); got != "[term]" {
			t.Fatalf("settled %s, want [term]", got)
		}
		var m dto.Metric
		if err := f.s.m.JobsRejected.WithLabelValues("dispatch", "undecodable").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
			t.Errorf("counted %v rejected undecodable (%v), want 1", m.GetCounter().GetValue(), err)
		}
	})
	t.Run("unverified is admitted again", func(t *testing.T) {
		t.Parallel()
		f := setup(t, answer(200, nil, okBody))
		j := f.job(t, "t") // its reservation carries no signature
		j.Endpoint = job.EndpointChat
		msg := &recorded{}
		f.s.acknowledge(msg, j, f.s.verifyThenRun(context.Background(), msg, j, nil))
		if got := msg.got(); got != "[ack]" {
			t.Fatalf("settled %s, want [ack]", got)
		}
		if n := f.client.made(); n != 0 {
			t.Fatalf("provider calls %d, want 0", n)
		}
		if q := f.queued(t); q.ID != j.ID || q.Reservation != nil {
			t.Fatalf("queued %s with reservation %+v; want %s without one", q.ID, q.Reservation, j.ID)
		}
	})
	t.Run("unknown tenant", func(t *testing.T) {
		t.Parallel()
		f := setup(t, answer(200, nil, okBody))
		j := f.job(t, "t")
		j.Endpoint, j.Tenant = job.EndpointChat, "nobody"
		msg := &recorded{}
		f.s.acknowledge(msg, j, f.s.verifyThenRun(context.Background(), msg, j, nil))
		if got := msg.got(); got != "[term]" {
			t.Fatalf("settled %s, want [term]", got)
		}
		if n := f.client.made(); n != 0 {
			t.Fatalf("provider calls %d, want 0", n)
		}
	})
	t.Run("invalid job ends failed", func(t *testing.T) {
		t.Parallel()
		f := setup(t, answer(200, nil, okBody))
		j := f.job(t, "t")
		j.Endpoint = "/v1/nowhere"
		msg := &recorded{}
		f.s.acknowledge(msg, j, f.s.verifyThenRun(context.Background(), msg, j, nil))
		if got := msg.got(); got != "[ack]" {
			t.Fatalf("settled %s, want [ack]", got)
		}
		if r := f.result(t, j); r.Status != job.StatusFailed {
			t.Fatalf("result %s, want failed", r.Status)
		}
		if n := f.client.made(); n != 0 {
			t.Fatalf("provider calls %d, want 0", n)
		}
	})
	t.Run("called once and acknowledged", func(t *testing.T) {
		t.Parallel()
		f := setup(t, answer(200, nil, okBody))
		j := f.job(t, "t")
		msg := &recorded{}
		f.s.acknowledge(msg, j, f.s.run(context.Background(), msg, j))
		if got := msg.got(); got != "[ack]" {
			t.Fatalf("settled %s, want [ack]", got)
		}
		if n := f.client.made(); n != 1 {
			t.Fatalf("provider calls %d, want 1", n)
		}
		if op := f.op(t, j); op.Sent == nil {
			t.Fatal("operation has no sent mark after its call")
		}
	})
	t.Run("lost call waits, uncalled", func(t *testing.T) {
		t.Parallel()
		f := setup(t, answer(200, nil, okBody))
		j := f.job(t, "t")
		opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
		if _, err := f.m.UpdateOp(context.Background(), opKey, func(o *mesh.OpRecord) bool {
			o.State, o.Sent = mesh.OpInFlight, &mesh.SentMark{Attempt: 1, At: time.Now().UTC(), Reservation: j.Reservation.ID}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		msg := &recorded{}
		f.s.acknowledge(msg, j, f.s.run(context.Background(), msg, j))
		if got := msg.got(); len(got) < 5 || got[:5] != "[nak " || got == "[nak 1s]" {
			t.Fatalf("settled %s, want a nak after the call's bound", got)
		}
		if n := f.client.made(); n != 0 {
			t.Fatalf("provider calls %d, want 0", n)
		}
	})
}
