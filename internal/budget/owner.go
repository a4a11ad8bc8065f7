package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
)

// # One owner per schedule
//
// Every write of a model's schedule is a compare-and-set of one KV record,
// and a record's compare-and-sets are serial: N processes writing it share
// one rate, and lose more of it to conflicts the more they are. So one
// process, elected per schedule, writes it for all: the others send it
// their writes (Op) on the schedule's subject (OwnerSubject, request and
// reply, one queue group), and it applies all that arrived while it wrote
// last in one compare-and-set, as it would its own. The rate of one
// writer, shared by none, and a write carries many.
//
// Correctness never rests on the owner. The KV compare-and-set stays the
// truth: two owners at once (a handover) cost conflicts, never room
// counted twice. An asker that finds no owner (no responders) writes the
// KV itself, at once; one that has no answer within Wait does too for a
// placement or a settlement (should the owner have written it after all,
// it is charged twice: errs towards the limits), and leaves a give-back
// spent (applied twice it would not err so). An owner drops a placement or
// settlement that waited Wait in its queue: its asker has written it.
//
// The election is a record per schedule (keys.ScheduleOwner) in the
// budgets bucket, renewed by its owner every TTL/3 with a compare-and-set.
// Another process takes it over, by compare-and-set at the revision it
// watched, once that revision has stood still TTL by its own clock (no
// clock of another process is read), or creates it when it is absent. An
// owner that stops deletes the record; one that dies leaves it to lapse,
// and meanwhile its askers find no responders and write the KV
// themselves.

// OwnerSubjectPrefix starts the subject of every schedule's owner.
const OwnerSubjectPrefix = "sluice.budget."

// OwnerSubject is the subject the owner of key's schedule serves.
func OwnerSubject(key string) string { return OwnerSubjectPrefix + key }

// Owner defaults: how long an asker waits for the owner's answer, and how
// long an owner's record may stand unrenewed before another takes it.
const (
	DefaultOwnerWait = 100 * time.Millisecond
	DefaultOwnerTTL  = 3 * time.Second
)

// maxBatch bounds the writes an owner applies in one compare-and-set; a
// queue of 4 batches bounds what waits (beyond it askers write the KV).
const maxBatch = 256

// Paths a write takes, for metrics (Owners.Count).
const (
	PathServed    = "served"    // applied by this process as the schedule's owner
	PathForwarded = "forwarded" // applied by another process, the owner
	PathFallback  = "fallback"  // written to the KV here: no owner, or none answered in time
	PathDropped   = "dropped"   // a give-back no owner confirmed in time: left spent
)

// OwnerKV is what the election needs of the budgets bucket.
type OwnerKV interface {
	KV
	Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error
}

// Owners routes the writes of a paced Store's schedules through their
// owners, and serves the schedules this process owns, while Run runs.
type Owners struct {
	st     *Store
	nc     *nats.Conn
	kv     OwnerKV
	record []byte
	// Wait bounds an asker's wait for the owner; TTL is the election's.
	Wait, TTL time.Duration
	// Count is told the path (Path*) of n writes routed; may be nil.
	Count func(path string, n int)
	Log   *slog.Logger

	mu      sync.Mutex
	running bool
	keys    map[string]*keyState
	kick    chan struct{}
	wg      sync.WaitGroup
}

// keyState is one schedule as this process sees its election.
type keyState struct {
	sv   *serving  // non-nil: this process owns and serves it (under Owners.mu)
	rev  uint64    // the owner record's revision last seen or written
	seen time.Time // when rev was first seen, by this process's clock
}

// NewOwners routes st's writes through the schedules' owners (st.Owners),
// asking over nc and electing in kv. While Run runs, this process is a
// candidate for every schedule it writes, and serves those it wins.
func NewOwners(st *Store, nc *nats.Conn, kv OwnerKV, log *slog.Logger) *Owners {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rec, _ := json.Marshal(map[string]string{"holder": nuid.Next()})
	o := &Owners{st: st, nc: nc, kv: kv, record: rec, Wait: DefaultOwnerWait, TTL: DefaultOwnerTTL,
		Log: log, keys: map[string]*keyState{}, kick: make(chan struct{}, 1)}
	st.Owners = o
	return o
}

func (o *Owners) count(path string, n int) {
	if o.Count != nil {
		o.Count(path, n)
	}
}

// Run keeps this process in the election of every schedule it has
// written, and serves those it wins, until ctx ends; then it stops
// serving and gives up its records.
func (o *Owners) Run(ctx context.Context) error {
	o.mu.Lock()
	o.running = true
	o.mu.Unlock()
	tick := time.NewTicker(max(o.TTL/3, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			o.stop()
			return nil
		case <-tick.C:
		case <-o.kick:
		}
		o.mu.Lock()
		ks := make([]string, 0, len(o.keys))
		for key := range o.keys {
			ks = append(ks, key)
		}
		o.mu.Unlock()
		for _, key := range ks {
			o.elect(ctx, key)
		}
	}
}

// stop ends serving and deletes the records this process holds.
func (o *Owners) stop() {
	o.mu.Lock()
	o.running = false
	held := map[string]uint64{}
	for key, k := range o.keys {
		if k.sv != nil {
			held[key] = k.rev
			o.resignLocked(k)
		}
	}
	o.mu.Unlock()
	o.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), o.TTL)
	defer cancel()
	for key, rev := range held {
		if err := o.kv.Delete(ctx, keys.ScheduleOwner(key), jetstream.LastRevision(rev)); err != nil {
			o.Log.Debug("budget owner: give up the schedule", "key", key, "err", err)
		}
	}
}

// elect renews key's record when this process owns the schedule, else
// takes it when absent or unrenewed for TTL.
func (o *Owners) elect(ctx context.Context, key string) {
	o.mu.Lock()
	k := o.keys[key]
	mine, rev, seen := k.sv != nil, k.rev, k.seen
	o.mu.Unlock()
	rk := keys.ScheduleOwner(key)
	if mine {
		next, err := o.kv.Update(ctx, rk, o.record, rev)
		o.mu.Lock()
		defer o.mu.Unlock()
		switch {
		case err == nil:
			k.rev = next
		case IsConflict(err) && k.sv != nil:
			o.Log.Info("budget owner: another process took the schedule", "key", key)
			o.resignLocked(k)
		}
		return
	}
	e, err := o.kv.Get(ctx, rk)
	now := time.Now()
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		if next, err := o.kv.Create(ctx, rk, o.record); err == nil {
			o.own(key, k, next)
		}
	case err != nil:
	case e.Revision() != rev:
		o.mu.Lock()
		k.rev, k.seen = e.Revision(), now
		o.mu.Unlock()
	case now.Sub(seen) >= o.TTL:
		if next, err := o.kv.Update(ctx, rk, o.record, rev); err == nil {
			o.own(key, k, next)
		}
	}
}

// own starts serving key's schedule, its record at revision rev.
func (o *Owners) own(key string, k *keyState, rev uint64) {
	sv := &serving{in: make(chan *request, 4*maxBatch), stop: make(chan struct{})}
	sub, err := o.nc.QueueSubscribe(OwnerSubject(key), "owner", func(m *nats.Msg) { o.receive(k, sv, m) })
	o.mu.Lock()
	defer o.mu.Unlock()
	k.rev, k.seen = rev, time.Now()
	if err != nil || !o.running {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
		return // its record lapses: another takes over after TTL
	}
	sv.sub, k.sv = sub, sv
	o.Log.Info("budget owner: serving the schedule", "key", key)
	o.wg.Go(func() { o.serve(key, sv) })
}

// resignLocked stops serving k's schedule (under o.mu): no more requests
// reach it, and those queued are refused (their askers write the KV).
func (o *Owners) resignLocked(k *keyState) {
	_ = k.sv.sub.Unsubscribe()
	close(k.sv.stop)
	k.sv = nil
}

// keyOf is key's state, registered (its election starts while Run runs)
// on first use.
func (o *Owners) keyOf(key string) (*keyState, *serving) {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := o.keys[key]
	if k == nil {
		k = &keyState{}
		o.keys[key] = k
		select {
		case o.kick <- struct{}{}:
		default:
		}
	}
	return k, k.sv
}

// ask has op applied to key's schedule by its owner; done is false when
// the caller is to write the KV itself.
func (o *Owners) ask(ctx context.Context, key string, op *Op) (done bool, err error) {
	k, sv := o.keyOf(key)
	if sv != nil {
		r := &request{op: op, done: make(chan error, 1), at: time.Now()}
		if !o.enqueue(k, sv, r) {
			o.count(PathFallback, 1)
			return false, nil
		}
		err := <-r.done
		if errors.Is(err, errNotServed) {
			o.count(PathFallback, 1)
			return false, nil
		}
		return true, err
	}
	return o.forward(ctx, key, op)
}

// errNotServed: the owner did not apply the write (it stopped, or it was
// too late or too busy); the asker writes the KV itself.
var errNotServed = errors.New("budget owner: not served")

// reply is an owner's answer.
type reply struct {
	Grant     Grant  `json:"grant,omitzero"`
	Err       string `json:"err,omitempty"`
	NotServed bool   `json:"not_served,omitempty"`
}

// forward sends op to the owner in another process.
func (o *Owners) forward(ctx context.Context, key string, op *Op) (bool, error) {
	data, err := json.Marshal(op)
	if err != nil {
		return true, err
	}
	rctx, cancel := context.WithTimeout(ctx, o.Wait)
	m, err := o.nc.RequestWithContext(rctx, OwnerSubject(key), data)
	cancel()
	var rp reply
	switch {
	case ctx.Err() != nil:
		return true, fmt.Errorf("%w: %s %s: %w", ErrUnavailable, op.Kind, key, ctx.Err())
	case err != nil && op.gives() && !errors.Is(err, nats.ErrNoResponders):
		o.count(PathDropped, 1)
		return true, nil
	case err != nil:
		o.count(PathFallback, 1)
		return false, nil
	case json.Unmarshal(m.Data, &rp) != nil, rp.NotServed:
		o.count(PathFallback, 1)
		return false, nil
	case rp.Err != "":
		return true, fmt.Errorf("%w: %s %s (its owner): %s", ErrUnavailable, op.Kind, key, rp.Err)
	}
	op.Grant = rp.Grant
	o.count(PathForwarded, 1)
	return true, nil
}

// serving is the owner's side of one schedule.
type serving struct {
	in   chan *request
	sub  *nats.Subscription
	stop chan struct{}
}

// request is a write waiting for the owner: another process's (msg) or
// this one's (done).
type request struct {
	op   *Op
	msg  *nats.Msg
	done chan error
	at   time.Time
}

// enqueue queues r unless sv no longer serves or its queue is full.
func (o *Owners) enqueue(k *keyState, sv *serving, r *request) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if k.sv != sv {
		return false
	}
	select {
	case sv.in <- r:
		return true
	default:
		return false
	}
}

// receive queues another process's write, checked as anything read from
// NATS is.
func (o *Owners) receive(k *keyState, sv *serving, m *nats.Msg) {
	if !mesh.ReplyAllowed(m.Reply, "") {
		return
	}
	var op Op
	if err := json.Unmarshal(m.Data, &op); err != nil || !op.valid() {
		_ = m.Respond(mustJSON(reply{Err: "malformed write"}))
		return
	}
	if !o.enqueue(k, sv, &request{op: &op, msg: m, at: time.Now()}) {
		_ = m.Respond(mustJSON(reply{NotServed: true}))
	}
}

// serve applies the writes queued for key, as many as wait (up to
// maxBatch) in one compare-and-set, until sv stops.
func (o *Owners) serve(key string, sv *serving) {
	batch := make([]*request, 0, maxBatch)
	for {
		select {
		case r := <-sv.in:
			batch = append(batch[:0], r)
		case <-sv.stop:
			for {
				select {
				case r := <-sv.in:
					o.answer(r, errNotServed)
				default:
					return
				}
			}
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case r := <-sv.in:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		o.applyBatch(key, batch)
	}
}

// applyBatch applies batch in one compare-and-set and answers each.
// Another process's placement or settlement that waited Wait is not
// applied: its asker has written it.
func (o *Owners) applyBatch(key string, batch []*request) {
	ops := make([]*Op, 0, len(batch))
	live := batch[:0]
	for _, r := range batch {
		if r.msg != nil && !r.op.gives() && time.Since(r.at) >= o.Wait {
			o.answer(r, errNotServed)
			continue
		}
		ops = append(ops, r.op)
		live = append(live, r)
	}
	if len(ops) == 0 {
		return
	}
	err := o.st.applyAll(context.Background(), key, ops)
	if err == nil {
		o.count(PathServed, len(ops))
	}
	for _, r := range live {
		o.answer(r, err)
	}
}

// answer tells r's asker what became of its write.
func (o *Owners) answer(r *request, err error) {
	if r.msg == nil {
		r.done <- err
		return
	}
	rp := reply{Grant: r.op.Grant}
	switch {
	case errors.Is(err, errNotServed):
		rp = reply{NotServed: true}
	case err != nil:
		rp = reply{Err: err.Error()}
	}
	_ = r.msg.Respond(mustJSON(rp))
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// valid reports whether op is a write an owner may apply: a known kind,
// no negative amount (it would make room), within the bounds of a batch.
func (op *Op) valid() bool {
	if len(op.Costs) > maxCoalesced || len(op.Returns) > maxCoalesced || len(op.Settles) > maxCoalesced || len(op.NotBefore) > len(op.Costs) {
		return false
	}
	neg := func(c Cost) bool { return negative(c.vec()) }
	for _, c := range op.Costs {
		if neg(c) {
			return false
		}
	}
	for _, r := range op.Returns {
		if neg(r.Cost) {
			return false
		}
	}
	for _, s := range op.Settles {
		if neg(s.Extra) {
			return false
		}
	}
	switch op.Kind {
	case OpTake, OpReturn, OpLapsed, OpRewind, OpSettle:
		return op.Lead >= 0
	}
	return false
}

func negative(v Vec) bool {
	for _, x := range v {
		if x < 0 {
			return true
		}
	}
	return false
}
