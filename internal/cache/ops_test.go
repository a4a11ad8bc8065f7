package cache

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/natstest"
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
		c.Store(ctx, app, k.tenant, &job.CacheTarget{Key: k.key, TTL: time.Minute}, res)
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
	if st.Entries != 4 || st.ByScope["tenant acme"] != 2 || st.ByScope["scope docs"] != 1 || st.ByModel["m1"] != 3 || st.MaxBytes <= 0 {
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
