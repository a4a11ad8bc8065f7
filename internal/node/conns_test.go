package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/node"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
)

// TestServicesHaveTheirOwnConnections: each service of a node talks to
// NATS over a connection of its own, as it would in a process of its own,
// and the node's own work over another. On one shared connection every
// stage's deliveries and acknowledgements queued behind the others' in
// one reader on each side: each hop of a job took about three times as
// long (docs/BENCHMARKS.md, the overhead benchmark's serial test).
func TestServicesHaveTheirOwnConnections(t *testing.T) {
	t.Parallel()
	cfg, _ := testConfig(t)
	info, _ := runNode(t, node.Options{Config: cfg, HTTP: "127.0.0.1:0", Data: t.TempDir()})
	cl, err := client.New(connect(t, info.NATSURL, client.TenantUser("acme", env["ACME_KEY"])))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if res, err := cl.Do(ctx, &job.Job{Tenant: "acme", Request: chat(3)}); err != nil || res.Status != job.StatusSucceeded {
		t.Fatalf("a job: %+v, %v; want succeeded", res, err)
	}
	own, svc := info.Conns()
	seen := map[any]string{own: "the node"}
	for _, name := range node.AllServices {
		nc := svc[name]
		if nc == nil {
			t.Errorf("%s: no connection of its own", name)
			continue
		}
		if other, dup := seen[nc]; dup {
			t.Errorf("%s shares its connection with %s", name, other)
		}
		seen[nc] = name
		// Each took its part of the job's messages over its own.
		if st := nc.Stats(); st.InMsgs == 0 || st.OutMsgs == 0 {
			t.Errorf("%s's connection carried %d messages in, %d out; want its part of the job", name, st.InMsgs, st.OutMsgs)
		}
	}
}
