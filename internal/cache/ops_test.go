package cache

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// TestStoreStatsPurge stores answers in a real bucket, counts them, and
// purges by tenant and by model.
func TestStoreStatsPurge(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(natstest.Conn(t, natstest.Server(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, streams.Options{}); err != nil {
		t.Fatal(err)
	}
	kv, err := Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	app := planConfig(t)
	c := New(kv, nil, nil)
	res := &job.Result{Status: job.StatusSucceeded, Usage: &job.Usage{PromptTokens: 3, CompletionTokens: 2},
		Response: json.RawMessage(`{"choices":[{"finish_reason":"stop","message":{"content":"ok"}}]}`)}
	for _, k := range []struct{ tenant, key string }{
		{"acme", "t.acme.m1.a1"}, {"acme", "t.acme.m2.a2"}, {"globex", "t.globex.m1.g1"}, {"acme", "s.docs.m1.d1"},
		{"acme", "t.globex.m1.forged"}, // refused: not acme's
	} {
		c.Store(ctx, app, k.tenant, &task.CacheTarget{Key: k.key, TTL: time.Minute}, res)
	}
	e, _, ok := c.Get(ctx, "t.acme.m1.a1")
	if !ok || e.Usage.PromptTokens != 3 || string(e.Response) != string(res.Response) {
		t.Fatalf("get: %+v %v", e, ok)
	}
	if _, _, ok := c.Get(ctx, "t.globex.m1.forged"); ok {
		t.Error("a target of another tenant was stored")
	}
	st, err := ReadStats(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries != 4 || st.ByScope["tenant acme"] != 2 || st.ByScope["scope docs"] != 1 || st.ByModel["m1"] != 3 || st.MaxBytes <= 0 ||
		!st.Evicts || st.Oldest.IsZero() || time.Since(st.Oldest) < 0 {
		t.Errorf("stats %+v", st)
	}
	if n, err := Purge(ctx, kv, "acme", "m1"); err != nil || n != 1 {
		t.Errorf("purge acme m1: %d, %v", n, err)
	}
	if n, err := Purge(ctx, kv, "", "m1"); err != nil || n != 2 {
		t.Errorf("purge m1: %d, %v; want globex's and the shared scope's", n, err)
	}
	if n, err := Purge(ctx, kv, "", ""); err != nil || n != 1 {
		t.Errorf("purge all: %d, %v", n, err)
	}
	if st, _ := ReadStats(ctx, kv); st.Entries != 0 {
		t.Errorf("%d entries after purging all", st.Entries)
	}
}

// TestFullCacheEvicts fills a bucket bounded at 1 MiB, made first the way
// an older Sluice made it (refusing new entries when full): Ensure turns
// it into one that drops its oldest entries, so a full cache still stores
// new answers, the newest are read back, and the oldest are gone.
func TestFullCacheEvicts(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(natstest.Conn(t, natstest.Server(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bs, err := streams.Buckets()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		if b.Bucket == streams.BucketCache {
			b.MaxBytes = 1 << 20
			if _, err := js.CreateKeyValue(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := streams.Ensure(ctx, js, streams.Options{CacheBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	kv, err := Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	c := New(kv, prometheus.NewRegistry(), nil)
	c.storeWait = time.Minute // a slow machine's store is late, not failed
	app := planConfig(t)
	text := strings.Repeat("x", 100<<10)
	res := &job.Result{Status: job.StatusSucceeded, Usage: &job.Usage{PromptTokens: 3, CompletionTokens: 2},
		Response: json.RawMessage(`{"choices":[{"finish_reason":"stop","message":{"content":"` + text + `"}}]}`)}
	const n = 30 // about 3 MiB into 1 MiB
	key := func(i int) string { return fmt.Sprintf("t.acme.m1.k%02d", i) }
	for i := range n {
		c.Store(ctx, app, "acme", &task.CacheTarget{Key: key(i), TTL: time.Hour}, res)
	}
	var stored dto.Metric
	if err := c.m.stores.WithLabelValues("stored").Write(&stored); err != nil {
		t.Fatal(err)
	}
	if got := stored.GetCounter().GetValue(); got != n {
		t.Errorf("%v of %d answers stored into a full cache, want every one", got, n)
	}
	for i := n - 3; i < n; i++ {
		if _, _, ok := c.Get(ctx, key(i)); !ok {
			t.Errorf("entry %d of %d (among the newest) is not there", i, n)
		}
	}
	for i := range 3 {
		if _, _, ok := c.Get(ctx, key(i)); ok {
			t.Errorf("entry %d of %d (among the oldest) is still there in a bucket of a third of their size", i, n)
		}
	}
	st, err := ReadStats(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	if st.Bytes > 1<<20 || st.Entries == 0 || st.Entries >= n {
		t.Errorf("stats %+v: want at most 1 MiB, some entries, not all %d", st, n)
	}
}
