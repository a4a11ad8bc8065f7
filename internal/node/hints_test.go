package node

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
)

// TestHintsOnTheirOwnConnection: wait-hint requests, which tenants
// publish and may make as large as a job, reach ingest on a connection of
// its own: a flood of them adds nothing to the connection the services'
// JetStream traffic rides (when they shared it, one tenant's flood of
// large hints stalled every tenant's chats for seconds), and hints are
// still answered.
func TestHintsOnTheirOwnConnection(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte("tenants: [{name: acme, api_key_env: ACME_KEY}]\nproviders: [{name: p, base_url: 'http://127.0.0.1:1/v1', models: [{name: m, rpm: 60, tpm: 100000}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan Info, 1)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node: %v", err)
		}
	}()
	data := t.TempDir()
	go func() {
		done <- Run(ctx, Options{Config: cfg, NATSListen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Data: data,
			Services: []string{"ingest"}, Getenv: func(k string) string { return map[string]string{"ACME_KEY": "acme-key"}[k] }, OnReady: func(i Info) { ready <- i }})
	}()
	var info Info
	select {
	case info = <-ready:
	case err := <-done:
		done <- err
		t.Fatalf("Run ended before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not ready in 30s")
	}
	producer, err := nats.Connect(info.NATSURL, client.TenantUser("acme", "acme-key"))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()

	before := info.conn.Stats().InBytes
	const n, size = 200, 100 << 10
	payload := bytes.Repeat([]byte("x"), size)
	for range n {
		if err := producer.Publish(job.WaitSubject("acme"), payload); err != nil {
			t.Fatal(err)
		}
	}
	if err := producer.Flush(); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	m, err := producer.RequestWithContext(rctx, job.WaitSubject("acme"), []byte(`{"model":"m"}`))
	if err != nil {
		t.Fatalf("a wait hint after the flood: %v, want an answer", err)
	}
	var wh job.WaitHint
	if err := json.Unmarshal(m.Data, &wh); err != nil {
		t.Fatalf("wait hint %q: %v", m.Data, err)
	}
	if got := info.conn.Stats().InBytes - before; got > n*size/10 {
		t.Errorf("the services' connection received %d bytes during a %d-byte hint flood, want the flood on the hints' own connection", got, n*size)
	}
}
