package budget_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/fakeclock"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeKV is an in-memory budget.KV with revisions. Its conflict errors have
// the shapes jetstream's KeyValue returns: Create of an existing key wraps an
// APIError that matches jetstream.ErrKeyExists, Update with a stale revision
// wraps jetstream.ErrKeyRevisionMismatch.
type fakeKV struct {
	// Set before use, never changed while the KV is shared.
	replicated   bool             // report conflicts with code 10164, as R>1 streams do
	beforeGet    func(key string) // called before each Get, without the lock
	beforeUpdate func(key string) // called before each Create or Update, without the lock
	getErr       error            // returned by Get when set
	writeErr     error            // returned by Create and Update when set
	created      func() time.Time // entry creation time; may be nil

	mu        sync.Mutex
	seq       uint64
	entries   map[string]fakeEntry
	writes    int
	conflicts int
}

var _ budget.KV = (*fakeKV)(nil)

func newFakeKV() *fakeKV { return &fakeKV{entries: map[string]fakeEntry{}} }

type fakeEntry struct {
	key     string
	value   []byte
	rev     uint64
	created time.Time
}

var _ jetstream.KeyValueEntry = fakeEntry{}

func (e fakeEntry) Bucket() string                  { return "budgets" }
func (e fakeEntry) Key() string                     { return e.key }
func (e fakeEntry) Value() []byte                   { return e.value }
func (e fakeEntry) Revision() uint64                { return e.rev }
func (e fakeEntry) Created() time.Time              { return e.created }
func (e fakeEntry) Delta() uint64                   { return 0 }
func (e fakeEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }

func (kv *fakeKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if kv.beforeGet != nil {
		kv.beforeGet(key)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if kv.getErr != nil {
		return nil, kv.getErr
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	e, ok := kv.entries[key]
	if !ok {
		return nil, jetstream.ErrKeyNotFound
	}
	e.value = bytes.Clone(e.value)
	return e, nil
}

func (kv *fakeKV) wrongLastSequence() *jetstream.APIError {
	code := jetstream.JSErrCodeStreamWrongLastSequence
	if kv.replicated {
		code = jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return &jetstream.APIError{Code: 400, ErrorCode: code, Description: "wrong last sequence"}
}

func (kv *fakeKV) Create(ctx context.Context, key string, value []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	if kv.beforeUpdate != nil {
		kv.beforeUpdate(key)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if kv.writeErr != nil {
		return 0, kv.writeErr
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	if _, ok := kv.entries[key]; ok {
		kv.conflicts++
		if kv.replicated {
			return 0, fmt.Errorf("%w: %w", kv.wrongLastSequence(), jetstream.ErrKeyExists)
		}
		return 0, fmt.Errorf("%w: key exists", kv.wrongLastSequence())
	}
	return kv.put(key, value), nil
}

func (kv *fakeKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if kv.beforeUpdate != nil {
		kv.beforeUpdate(key)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if kv.writeErr != nil {
		return 0, kv.writeErr
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	if e, ok := kv.entries[key]; !ok || e.rev != revision {
		kv.conflicts++
		return 0, fmt.Errorf("%w: %w", kv.wrongLastSequence(), jetstream.ErrKeyRevisionMismatch)
	}
	return kv.put(key, value), nil
}

// put stores a value under the lock.
func (kv *fakeKV) put(key string, value []byte) uint64 {
	kv.seq++
	kv.writes++
	var created time.Time
	if kv.created != nil {
		created = kv.created()
	}
	kv.entries[key] = fakeEntry{key: key, value: bytes.Clone(value), rev: kv.seq, created: created}
	return kv.seq
}

// set stores a value directly.
func (kv *fakeKV) set(key string, value []byte) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	kv.put(key, value)
}

// stats returns the writes and lost compare-and-sets so far.
func (kv *fakeKV) stats() (writes, conflicts int) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return kv.writes, kv.conflicts
}

// revision returns key's revision, 0 when absent.
func (kv *fakeKV) revision(key string) uint64 {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return kv.entries[key].rev
}

// value returns key's stored bytes.
func (kv *fakeKV) value(key string) []byte {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return bytes.Clone(kv.entries[key].value)
}

// clone copies the stored state into a fresh fake without hooks.
func (kv *fakeKV) clone() *fakeKV {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	c := newFakeKV()
	c.seq = kv.seq
	c.entries = maps.Clone(kv.entries)
	return c
}

// t0 is a slice boundary for every slice length the tests use.
var t0 = time.Unix(1_750_000_000, 0)

// defaultParams are the configuration's defaults.
var defaultParams = budget.Params{Slice: 250 * time.Millisecond, DispatchGrace: time.Second, BurstFraction: 0.05}

// noBurst makes the burst cap as large as the minute limit, so only the
// minute limits bind.
var noBurst = budget.Params{Slice: 250 * time.Millisecond, DispatchGrace: time.Second, BurstFraction: 1}

const key = "rate.openai.gpt-4o-mini"

type bundle struct {
	p     budget.Params
	kv    *fakeKV
	clock *fakeclock.Clock
	store *budget.Store
}

func setup(t testing.TB, p budget.Params) *bundle {
	t.Helper()
	kv := newFakeKV()
	clock := fakeclock.New(t0)
	kv.created = clock.Now
	return &bundle{p: p, kv: kv, clock: clock, store: budget.NewStore(kv, p, clock.Now)}
}

// at sets the clock to the start of slice k0+offset plus within and returns
// that slice.
func (b *bundle) at(offset int64, within time.Duration) int64 {
	k := sliceOf(b.p, t0) + offset
	b.clock.Set(sliceStart(b.p, k).Add(within))
	return k
}

func sliceOf(p budget.Params, t time.Time) int64 { return t.UnixNano() / int64(p.Slice) }

func sliceStart(p budget.Params, k int64) time.Time { return time.Unix(0, k*int64(p.Slice)) }

// costs repeats c n times.
func costs(n int, c budget.Cost) []budget.Cost {
	out := make([]budget.Cost, n)
	for i := range out {
		out[i] = c
	}
	return out
}

// checkGrant compares grants, times by instant.
func checkGrant(t testing.TB, what string, got, want budget.Grant) {
	t.Helper()
	if got.N != want.N || got.Slice != want.Slice || got.Reason != want.Reason ||
		!got.ValidUntil.Equal(want.ValidUntil) || !got.RetryAt.Equal(want.RetryAt) {
		t.Errorf("%s:\n got N=%d slice=%d reason=%q valid_until=%v retry_at=%v\nwant N=%d slice=%d reason=%q valid_until=%v retry_at=%v",
			what, got.N, got.Slice, got.Reason, got.ValidUntil.UTC(), got.RetryAt.UTC(),
			want.N, want.Slice, want.Reason, want.ValidUntil.UTC(), want.RetryAt.UTC())
	}
}
