package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/breaker"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/internal/route"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// caller owns whether an attempt's call leaves now: the steps execute
// runs, from the operation's claim to the call and its concluding.
type caller struct {
	*env
	fin      *finisher
	back     *requeuer
	marks    *marks
	str      *streamer
	epochs   *epochCache
	deps     *deployments
	fall     *fallbacks
	clients  *clientSet
	pools    *tenantPools
	transits *transits
}

// execute runs one attempt of a verified job. It returns an error only
// when the job should be redelivered as it is (the mesh could not record
// what happened). Each step either hands the attempt on or ends it (done),
// having settled what it found: the job ended, went back to admission, or
// moved to a fallback.
func (s *Service) execute(ctx context.Context, msg jetstream.Msg, j *task.Task) error {
	ctx = s.mesh.Tracing.FromMsg(ctx, msg) // under the placement
	a := s.call.newAttempt(msg, j)
	if done, err := s.call.prepare(ctx, a); done {
		return err
	}
	ctx = s.call.cancellable(ctx, a)
	defer a.close()
	if done, err := s.call.claim(ctx, a); done {
		return err
	}
	if done, err := s.call.admitCall(ctx, a); done {
		return err
	}
	if done, err := s.call.awaitInstant(ctx, a); done {
		return err
	}
	ctx = s.call.send(ctx, a)
	return s.out.conclude(ctx, a)
}

// attempt is one execution of a dispatched job, as its steps fill it in.
type attempt struct {
	msg       jetstream.Msg
	j         *task.Task
	opKey     string
	n         int       // this attempt's number (1 for the first)
	at        time.Time // when the execution began
	stream    bool      // the job asks for a streamed answer
	wantUsage bool      // and for its usage chunk

	// claim's: the call's mark in the operation record, and the record as
	// written (at opRev; 0: not known).
	sent    *mesh.SentMark
	op      *mesh.OpRecord
	opRev   uint64
	claimed bool // the operation is marked in flight by this attempt

	// admitCall's and awaitInstant's.
	client   provider.Client
	target   config.Target
	upstream string          // the model name the provider is sent ("": the job's)
	ticket   *breaker.Ticket // the breaker's leave to call
	until    time.Time       // the call's deadline
	sendBy   time.Time       // a paced call must leave by then (zero: no bound)

	// send's.
	start   time.Time
	elapsed time.Duration
	resp    *provider.Response
	cerr    error
	end     *streamEnd // a streamed call past its first token
	pub     *chunkPublisher

	release []func() // what close undoes, last first
}

func (s *caller) newAttempt(msg jetstream.Msg, j *task.Task) *attempt {
	opKey, _ := mesh.OpKey(j.Tenant, j.IdempotencyKey, j.ID)
	stream, wantUsage := streamed(j)
	return &attempt{msg: msg, j: j, opKey: opKey, n: len(j.Attempts) + 1, at: s.now(), stream: stream, wantUsage: wantUsage,
		target: config.Target{Provider: j.Provider, Model: j.Model}}
}

// onClose adds f to what close runs.
func (a *attempt) onClose(f func()) { a.release = append(a.release, f) }

// close releases what the attempt held (its call's context, the breaker's
// ticket, the tenant's slot, its cancellation), last taken first.
func (a *attempt) close() {
	for i := len(a.release) - 1; i >= 0; i-- {
		a.release[i]()
	}
}

// prepare ends a job whose deadline passed, and re-admits one whose
// reservation lapsed while it waited for a slot: calling now could exceed
// the limit the provider sees.
func (s *caller) prepare(ctx context.Context, a *attempt) (done bool, err error) {
	j := a.j
	if j.Deadline != nil && !j.Deadline.After(a.at) {
		return true, s.fin.finish(ctx, j, a.opKey, &mesh.Outcome{Status: job.StatusExpired, Error: &job.Error{Code: job.CodeDeadlineExpired, Message: "deadline passed before the provider call"}})
	}
	if j.Reservation == nil || a.at.After(j.Reservation.ValidUntil) {
		return true, s.back.notSent(ctx, a)
	}
	return false, nil
}

// cancellable lets a streamed job's caller stop its call: registered
// before the operation is marked in flight, so a cancellation that finds
// the record unmarked is heard here.
func (s *caller) cancellable(ctx context.Context, a *attempt) context.Context {
	if !a.stream {
		return ctx
	}
	ctx, cancelJob := context.WithCancelCause(ctx)
	a.onClose(func() { cancelJob(nil) })
	s.str.running.add(a.j.Key(), cancelJob)
	a.onClose(func() { s.str.running.remove(a.j.Key()) })
	return ctx
}

// claim marks the operation in flight for this attempt, with the mark that
// its call leaves (unknown.go): written milliseconds before the call and
// withdrawn by every way out that does not send. An operation already
// done, cancelled, or whose earlier call left and was lost ends here; a
// streamed job an earlier attempt left mid-stream resumes (resume.go).
func (s *caller) claim(ctx context.Context, a *attempt) (done bool, err error) {
	j := a.j
	a.sent = s.marks.newSentMark(j, a.n)
	var lost *mesh.SentMark
	cancelled, wasInFlight := false, false
	op, opRev, err := s.marks.markInFlight(ctx, j, a.opKey, a.n, a.sent, &lost, &cancelled, &wasInFlight)
	if errors.Is(err, job.ErrNotFound) {
		op, opRev, err = &mesh.OpRecord{State: mesh.OpInFlight}, 0, nil // records expire; the job still runs
	}
	if err != nil {
		s.marks.withdrawSent(ctx, a.opKey, a.sent) // the write may have landed without its answer
		return true, fmt.Errorf("mark in flight: %w", err)
	}
	a.op, a.opRev, a.claimed = op, opRev, true
	if j.Revs != nil {
		// Ingest's revision of the operation record is spent: a job that
		// goes back to admission from here carries no stale hint.
		j.Revs.Op = 0
	}
	switch {
	case op.State == mesh.OpCompleted || op.State == mesh.OpFailed:
		// Done before (a redelivery after a crash): its result is stored.
		s.m.DupSuppressed.WithLabelValues(s.app().TaskLabel(j.Task)).Inc()
		return true, nil
	case cancelled || context.Cause(ctx) == errCancelled:
		return true, s.str.cancelBeforeCall(ctx, j, a.opKey)
	case lost != nil:
		return true, s.marks.lostCall(ctx, j, a.opKey, lost, a.stream)
	}
	if a.stream && wasInFlight {
		// An earlier attempt may have streamed part of the answer and lost
		// its executor (resume.go).
		if ended, err := s.str.resumeStream(ctx, j, a.opKey); ended {
			return true, err
		}
	}
	return false, nil
}

// admitCall checks what this process needs to make the call: the model
// and its client, the tenant's concurrency slot (fleet-wide) and the
// provider's breaker. A job that must wait goes back to admission, or to a
// fallback when the provider is failing and a route names one.
func (s *caller) admitCall(ctx context.Context, a *attempt) (done bool, err error) {
	j := a.j
	prov, dm, ok := s.app().Deployment(j.Provider, j.Model)
	a.client = s.clients.client(j.Provider)
	if !ok || a.client == nil {
		return true, s.fin.finish(ctx, j, a.opKey, &mesh.Outcome{Status: job.StatusFailed, Error: &job.Error{Code: job.CodeUnknownModel, Message: fmt.Sprintf("model %q is not configured here", j.Model)}})
	}
	a.upstream = dm.UpstreamName()
	a.until = a.at.Add(prov.Timeout.D())
	if j.Deadline != nil && j.Deadline.Before(a.until) {
		a.until = *j.Deadline
	}
	if tp := s.pools.tenantPool(j.Tenant); tp != nil {
		if !tp.TryAcquire() {
			s.m.AdmissionWaits.WithLabelValues(j.Provider, j.Model, "tenant_concurrency").Inc()
			return true, s.back.backToAdmission(ctx, a, ptr(a.at.Add(TenantSlotWait)), "tenant slot", backTenantSlot)
		}
		a.onClose(tp.Release)
	}
	tk, openUntil := s.deps.take(ctx, j)
	// Every way out of the call settles the ticket: a half-open breaker's
	// probe slot left taken would stop the model in this process for good.
	a.ticket = tk
	a.onClose(tk.Release)
	if tk == nil {
		// The provider is failing: do not call it (health took the
		// deployment down). Another deployment of the model takes the job,
		// else a route's fallback, else it waits (by redelivery delay)
		// until the breaker probes.
		if s.deps.grouped(j) {
			return true, s.deps.replace(ctx, a, "breaker_open")
		}
		if fb, ok := s.fall.fallback(j, route.Situation{Current: a.target, Priority: string(j.Priority)}); ok {
			return true, s.fall.reroute(ctx, a.msg, j, a.opKey, fb)
		}
		s.m.AdmissionWaits.WithLabelValues(j.Provider, j.Model, "breaker_open").Inc()
		return true, s.back.backToAdmission(ctx, a, &openUntil, "breaker open", backBreaker)
	}
	return false, nil
}

// awaitInstant holds a paced call until its planned instant. The provider
// judges the instant the call arrives: not before the planned one, and not
// after the tolerance, or the plan that keeps every window under its limit
// does not hold.
func (s *caller) awaitInstant(ctx context.Context, a *attempt) (done bool, err error) {
	j, r := a.j, a.j.Reservation
	if r.SendAt.IsZero() {
		return false, nil
	}
	if s.epochs.drained(ctx, j) {
		// The limits were cut after this call was planned: it was paced at
		// the rate the provider just refused. Plan it again.
		s.m.RateLimitRequeues.WithLabelValues(j.Provider, j.Model, "drained").Inc()
		return true, s.back.backToAdmission(ctx, a, nil, "drain", backDrain)
	}
	s.transits.noteReady(ctx, a.msg, j)
	s.transits.noteWoke(ctx)
	if !waitInstant(ctx, r.Earliest()) {
		s.marks.withdrawSent(ctx, a.opKey, a.sent)
		return true, errors.New("shutting down before the send instant")
	}
	late := s.now().Sub(r.Earliest())
	// The call must also leave by then: checked again when its first byte
	// is written, after the connection was dialed or taken from the pool
	// (provider.Call.SendBy).
	a.sendBy = r.ValidUntil
	if s.now().After(a.sendBy) {
		return true, s.back.notSent(ctx, a)
	}
	s.m.SendLateness.WithLabelValues(j.Provider, j.Model).Observe(late.Seconds())
	return false, nil
}

// send makes the call, streamed when the job asks for it and the client
// can, and records what came back; nothing below it retries. It returns
// ctx with the call's span (trace.go), the parent of what follows.
func (s *caller) send(ctx context.Context, a *attempt) context.Context {
	j := a.j
	ctx, span := s.startCall(ctx, a)
	defer s.endCall(span, a)
	callCtx, cancel := context.WithDeadline(ctx, a.until)
	a.onClose(cancel)
	stop := keepAlive(callCtx, a.msg)
	s.m.InFlight.WithLabelValues(j.Provider, j.Model).Inc()
	a.start = s.now()
	call := provider.Call{Provider: j.Provider, Model: j.Model, Endpoint: j.Endpoint, Body: j.Request, IdempotencyKey: mesh.CallKey(j, a.opKey), JobID: j.ID, SendBy: a.sendBy}
	if sc, ok := a.client.(provider.Streamer); a.stream && ok {
		// Usage is always asked for: the budget settles from it, and the
		// caller gets the usage chunk only if it asked.
		call.Body = job.WithMember(j.Request, "stream_options", json.RawMessage(`{"include_usage":true}`))
		a.pub = newChunkPublisher(s.mesh.JS, j, s.app().Streaming.FlushInterval.D(), s.now, func(err error) {
			s.log.Warn("stream: chunks not published", "job_id", j.ID, "err", err)
		})
		a.resp, a.cerr, a.end = s.str.stream(callCtx, j, sc, withUpstream(call, a.upstream), a.wantUsage, a.pub)
	} else {
		a.resp, a.cerr = a.client.Do(callCtx, withUpstream(call, a.upstream))
	}
	a.elapsed = s.now().Sub(a.start)
	s.m.InFlight.WithLabelValues(j.Provider, j.Model).Dec()
	stop()
	return ctx
}

func ptr[T any](v T) *T { return &v }

// withUpstream names the deployment's upstream model (its UpstreamName) in
// the call when it differs from the caller's: the provider is sent that
// name, while the job, its result and its metrics keep the name the caller
// used.
func withUpstream(c provider.Call, upstream string) provider.Call {
	if upstream == c.Model {
		return c
	}
	name, _ := json.Marshal(upstream)
	c.Model, c.Body = upstream, job.WithMember(c.Body, "model", name)
	return c
}

// breakerGauge is sluice_breaker_state's value of each state.
var breakerGauge = map[breaker.State]float64{breaker.Closed: 0, breaker.HalfOpen: 1, breaker.Open: 2}
