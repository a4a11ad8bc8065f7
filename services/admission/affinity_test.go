package admission

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// heldKV is an empty bucket whose writes wait for release, telling
// writing when one starts.
type heldKV struct {
	writing chan struct{}
	release chan struct{}
}

func (k *heldKV) Get(context.Context, string) (jetstream.KeyValueEntry, error) {
	return nil, jetstream.ErrKeyNotFound
}

func (k *heldKV) Create(ctx context.Context, _ string, _ []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	k.writing <- struct{}{}
	select {
	case <-k.release:
		return 1, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (k *heldKV) Update(ctx context.Context, key string, value []byte, _ uint64) (uint64, error) {
	return k.Create(ctx, key, value)
}

// A placement being written is still this process's word: a lookup that
// reads the record again before the write lands finds it. Before, flush
// dropped the entries it was writing from what a lookup adds to the
// record it reads, and the next turn of a conversation placed in that
// moment went to another deployment (TestResponsesAffinity, once each
// service had a connection of its own).
func TestAffinityWhileWritten(t *testing.T) {
	t.Parallel()
	kv := &heldKV{writing: make(chan struct{}, 1), release: make(chan struct{})}
	now := time.Now()
	clock := func() time.Time { return now }
	jobs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jobs"}, []string{"model", "outcome"})
	a := newAffinityTable(kv, clock, time.Minute, time.Second, jobs)
	j := &task.Task{Job: job.Job{Tenant: "acme", Affinity: "conversation-1"}, Model: "m"}
	a.placed(j, "ptu", "")
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		a.flush(context.Background())
	}()
	select {
	case <-kv.writing:
	case <-time.After(10 * time.Second):
		t.Fatal("flush did not write in 10s")
	}
	// No view of the record yet: the lookup reads it.
	e, ok := a.lookup(context.Background(), affinityRecord(j), affinityHash(j.Affinity), now)
	close(kv.release)
	<-flushed
	if !ok || e.P != "ptu" {
		t.Errorf("lookup while the placement is written: %+v (found %v), want ptu", e, ok)
	}
}
