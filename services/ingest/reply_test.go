package ingest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// TestWaitHintAnswersOnlyReplies: where no account boundary maps a
// tenant's reply subject (here a server without accounts), ingest still
// answers a wait hint only on a reply inbox, never on a subject a
// requester aimed elsewhere (another tenant's results, a bucket's key).
func TestWaitHintAnswersOnlyReplies(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.svc.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	answering(t, f.nc, "acme", []byte(`{}`))
	watch, err := f.nc.SubscribeSync(job.ResultPrefix + "beta.>")
	if err != nil {
		t.Fatal(err)
	}
	aimed := []string{job.ResultSubject("beta", job.NewID()), "$KV." + streams.BucketBudgets + ".probe", client.InboxPrefix("beta") + ".x",
		"bad..subject", "sluice.result.beta.*"}
	for _, reply := range aimed {
		if err := f.nc.PublishRequest(job.WaitSubject("acme"), reply, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	// Replies to an inbox are answered (and come after the ones above).
	if _, err := f.nc.Request(job.WaitSubject("acme"), []byte(`{}`), 5*time.Second); err != nil {
		t.Errorf("a request with nats.go's default inbox: %v", err)
	}
	own, err := nats.Connect(f.nc.ConnectedUrl(), nats.CustomInboxPrefix(client.InboxPrefix("acme")))
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if _, err := own.Request(job.WaitSubject("acme"), []byte(`{}`), 5*time.Second); err != nil {
		t.Errorf("a request with the tenant's own inbox: %v", err)
	}
	if m, err := watch.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("a wait hint reached %s: %q", m.Subject, m.Data)
	}
	kv, err := f.js.KeyValue(ctx, streams.BucketBudgets)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "probe"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("budgets key probe: %v, want not found", err)
	}
	var dropped dto.Metric
	if err := f.svc.m.RepliesDropped.WithLabelValues("ingest").Write(&dropped); err != nil {
		t.Fatal(err)
	}
	if got := dropped.GetCounter().GetValue(); got != float64(len(aimed)) {
		t.Errorf("replies dropped = %v, want %d", got, len(aimed))
	}
}
