package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/node"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/job"
)

// tenant is the one tenant the benchmarks submit as.
const tenant = "bench"

// nodeSpec is what an in-process Sluice for a benchmark needs.
type nodeSpec struct {
	providerURL    string // …/v1
	rpm, tpm       int    // the model's limits (0 = unlimited)
	maxConcurrency int
	retry          RetryPolicy
	maxElapsed     time.Duration // retry budget per job
	log            *slog.Logger
}

// meshNode is a running in-process Sluice: embedded NATS on a free loopback
// port, a fresh store in a temp directory, every service, HTTP off.
type meshNode struct {
	nc   *nats.Conn
	cl   *client.Client
	stop func() error
}

func startNode(ctx context.Context, s nodeSpec) (*meshNode, error) {
	r := s.retry
	policy := fmt.Sprintf("{max_attempts: %d, max_elapsed: %s, base_delay: %s, max_delay: %s}",
		r.MaxAttempts, max(s.maxElapsed, r.Max), r.Base, r.Max)
	cfg, err := config.Parse(fmt.Appendf(nil, `
providers:
  - name: sim
    base_url: %s
    models:
      - {name: %s, rpm: %d, tpm: %d, max_concurrency: %d}
tenants:
  - {name: %s}
retry:
  interactive: %s
  standard: %s
  batch: %s
`, s.providerURL, Model, s.rpm, s.tpm, s.maxConcurrency, tenant, policy, policy, policy))
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-bench-")
	if err != nil {
		return nil, err
	}
	nodeCtx, cancel := context.WithCancel(context.Background())
	ready := make(chan node.Info, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- node.Run(nodeCtx, node.Options{Config: cfg, NATSListen: "127.0.0.1:0", Data: dir, Log: s.log,
			OnReady: func(i node.Info) { ready <- i }})
	}()
	halt := func() error {
		cancel()
		err := <-errc
		if rerr := os.RemoveAll(dir); err == nil {
			err = rerr
		}
		return err
	}
	var info node.Info
	select {
	case info = <-ready:
	case err := <-errc:
		cancel()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start sluice: %w", err)
	case <-ctx.Done():
		_ = halt()
		return nil, ctx.Err()
	}
	nc, err := nats.Connect(info.NATSURL, nats.Name("sluice bench"))
	if err != nil {
		_ = halt()
		return nil, fmt.Errorf("connect to sluice: %w", err)
	}
	cl, err := client.New(nc)
	if err != nil {
		nc.Close()
		_ = halt()
		return nil, err
	}
	return &meshNode{nc: nc, cl: cl, stop: func() error {
		nc.Close()
		return halt()
	}}, nil
}

// submit hands j to Sluice, waiting out "queue full" refusals.
func (n *meshNode) submit(ctx context.Context, j *job.Job) error {
	for {
		_, err := n.cl.Submit(ctx, j)
		var full *client.QueueFullError
		if !errors.As(err, &full) {
			return err
		}
		if !sleep(ctx, full.RetryAfter) {
			return ctx.Err()
		}
	}
}

// mesh is the sluice strategy: an in-process Sluice configured with the
// provider's limits, fed through the public Go client.
type mesh struct {
	spec nodeSpec
	node *meshNode
}

// submitters is how many goroutines hand jobs to Sluice at once.
const submitters = 8

func (m *mesh) prepare(ctx context.Context, baseURL string) error {
	m.spec.providerURL = baseURL
	n, err := startNode(ctx, m.spec)
	if err != nil {
		return err
	}
	m.node = n
	return nil
}

func (m *mesh) run(ctx context.Context, jobs []Job, t *tracker) {
	var mu sync.Mutex
	index := make(map[string]int, len(jobs))
	sub, err := m.node.cl.Subscribe(tenant, func(r *job.Result) {
		mu.Lock()
		i, ok := index[r.JobID]
		mu.Unlock()
		if ok {
			t.finish(i, r.Status == job.StatusSucceeded)
		}
	})
	if err != nil {
		return // every job stays unfinished: counted as failed
	}
	defer func() { _ = sub.Unsubscribe() }()
	next := make(chan int)
	var wg sync.WaitGroup
	for range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				j := &job.Job{ID: job.NewID(), Tenant: tenant, Priority: job.Standard, Request: jobs[i].Body}
				mu.Lock()
				index[j.ID] = i
				mu.Unlock()
				t.submitted(i, time.Now())
				if err := m.node.submit(ctx, j); err != nil && ctx.Err() == nil {
					t.finish(i, false)
				}
			}
		}()
	}
feed:
	for i := range jobs {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	select {
	case <-t.allDone:
	case <-ctx.Done():
	}
}

func (m *mesh) close() error {
	if m.node == nil {
		return nil
	}
	return m.node.stop()
}

var _ strategy = (*mesh)(nil)
