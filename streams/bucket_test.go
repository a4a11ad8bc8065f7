package streams

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/embedded"
	"github.com/sluice-dev/sluice/internal/natstest"
)

// TestKVStreamConfigMatchesNATS: the stream Ensure makes for a bucket is
// the one nats.go makes (bar direct gets): a bucket made either way binds
// and behaves the same, and a nats.go upgrade that changes its buckets
// fails here.
func TestKVStreamConfigMatchesNATS(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(natstest.Conn(t, natstest.Server(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bs, err := Buckets()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range bs {
		theirs, ours := c, c
		theirs.Bucket, ours.Bucket = "nats_"+c.Bucket, "ours_"+c.Bucket
		if _, err := js.CreateKeyValue(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateStream(ctx, kvStreamConfig(ours)); err != nil {
			t.Fatal(err)
		}
		get := func(bucket string) jetstream.StreamConfig {
			st, err := js.Stream(ctx, "KV_"+bucket)
			if err != nil {
				t.Fatal(err)
			}
			cfg := st.CachedInfo().Config
			cfg.Name = strings.Replace(cfg.Name, bucket, c.Bucket, 1)
			for i := range cfg.Subjects {
				cfg.Subjects[i] = strings.Replace(cfg.Subjects[i], bucket, c.Bucket, 1)
			}
			return cfg
		}
		if a, b := get(theirs.Bucket), get(ours.Bucket); !reflect.DeepEqual(a, b) {
			t.Errorf("bucket %s: nats.go makes\n%+v\nEnsure makes\n%+v", c.Bucket, a, b)
		}
		kv, err := js.KeyValue(ctx, ours.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Create(ctx, "k", []byte("v")); err != nil {
			t.Errorf("bucket %s made by Ensure: %v", c.Bucket, err)
		}
	}
}

// TestEnsureOnFormingCluster: three nodes of a JetStream cluster run
// Ensure at once, as `sluice up` does on each. Every stream and bucket
// ends replicated three times, and a bucket that takes compare-and-set
// traffic never has direct gets on, not for a moment: a process binding
// it then would read from followers for its whole life, and get "no
// responders" once they are off.
func TestEnsureOnFormingCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a forming cluster, about 15 s: the full tier runs it, not -short")
	}
	t.Parallel()
	var ls []net.Listener
	for range 6 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	var routes []string
	for i := range 3 {
		routes = append(routes, "nats://"+ls[3+i].Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	var jss []jetstream.JetStream
	for i := range 3 {
		s, err := embedded.Start(embedded.Options{Listen: ls[i].Addr().String(), StoreDir: t.TempDir(), Name: fmt.Sprintf("n%d", i+1),
			Cluster: ls[3+i].Addr().String(), Routes: routes})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			s.Shutdown()
			s.WaitForShutdown()
		})
		js, err := jetstream.New(natstest.Conn(t, s))
		if err != nil {
			t.Fatal(err)
		}
		jss = append(jss, js)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Watch the leader-read buckets' settings while the nodes make them.
	var sawDirect atomic.Value
	watch, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		natstest.Poll(watch, func() bool { // samples until the watch ends
			for _, b := range LeaderReadBuckets {
				rctx, c := context.WithTimeout(watch, 500*time.Millisecond)
				st, err := jss[0].Stream(rctx, "KV_"+b)
				c()
				if err == nil && st.CachedInfo().Config.AllowDirect {
					sawDirect.Store(b)
				}
			}
			return false
		})
	})
	errs := make([]error, 3)
	var ensure sync.WaitGroup
	for i, js := range jss {
		ensure.Go(func() {
			errs[i] = Retry(ctx, func(ctx context.Context) error { return Ensure(ctx, js, Options{Replicas: 3}) })
		})
	}
	ensure.Wait()
	stopWatch()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", i+1, err)
		}
	}
	if b := sawDirect.Load(); b != nil {
		t.Errorf("bucket %s had direct gets on while the cluster formed", b)
	}
	ss, _ := Streams()
	for _, c := range ss {
		st, err := jss[1].Stream(ctx, c.Name)
		if err != nil {
			t.Fatal(err)
		}
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("%s: %d replicas, want 3", c.Name, r)
		}
	}
	bs, _ := Buckets()
	for _, c := range bs {
		st, err := jss[2].Stream(ctx, "KV_"+c.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		if want := !slices.Contains(LeaderReadBuckets, c.Bucket); cfg.Replicas != 3 || cfg.AllowDirect != want {
			t.Errorf("bucket %s: %d replicas, direct gets %v; want 3 and %v", c.Bucket, cfg.Replicas, cfg.AllowDirect, want)
		}
		// Bound now, from every node, it reads (from the leader).
		for i, js := range jss {
			kv, err := js.KeyValue(ctx, c.Bucket)
			if err != nil {
				t.Fatal(err)
			}
			key := fmt.Sprintf("probe%d", i)
			if _, err := kv.Put(ctx, key, []byte("v")); err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Get(ctx, key); err != nil {
				t.Errorf("node %d, bucket %s: get: %v", i+1, c.Bucket, err)
			}
		}
	}
}
