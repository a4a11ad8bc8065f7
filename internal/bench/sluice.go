package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natsauth"
	"github.com/sluice-dev/sluice/internal/node"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
)

// tenant is the one tenant the benchmarks submit as.
const tenant = "bench"

// nodeSpec is what an in-process Sluice for a benchmark needs.
type nodeSpec struct {
	providerURL string // …/v1
	rpm, tpm    int    // the model's configured limits (0 = unlimited, or discovered)
	// kind "anthropic" serves model (default Model) from an anthropic
	// provider limited by itpm and otpm instead of tpm.
	kind, model    string
	itpm, otpm     int
	discover       bool // adaptive: true: limits configured as 0 are discovered
	maxConcurrency int
	retry          RetryPolicy
	maxElapsed     time.Duration // retry budget per job
	log            *slog.Logger
	// joiners are the service lists of the processes that join the first
	// one's NATS (none: a single node).
	joiners [][]string
	// nats: natsDefault (authentication on, as tenants are configured),
	// natsOpen (no authentication, no TLS), or natsSecure (authentication
	// and TLS, the benchmark's client connected as the tenant).
	nats natsMode
	// cluster > 1 runs that many in-process nodes, each embedding one
	// node of a JetStream cluster with every service, streams and
	// buckets replicated cluster times (natsOpen only).
	cluster int
	// env is more of the node's environment (OTEL_* for a traced run).
	env map[string]string
	// cache: the tenant's deterministic answers are cached (config
	// cache.tenants) and identical jobs coalesce.
	cache bool
	// providers, when set, is the configuration's providers list in
	// place of the one provider the fields above describe.
	providers string
}

type natsMode int

const (
	natsDefault natsMode = iota
	natsOpen
	natsSecure
)

// benchKeyEnv names the tenant's API key variable in natsSecure mode.
const benchKeyEnv = "SLUICE_BENCH_TENANT_KEY"

// Fleet is the shape of the Sluice lane in Run: one node embedding NATS with
// every service, and these processes joining it.
var Fleet = [][]string{{"admission"}, {"executor"}, {"executor"}}

// FleetDescription says what Fleet is, for reports.
func FleetDescription() string {
	parts := []string{"1 node with embedded NATS and " + strings.Join(node.AllServices, ",")}
	for _, s := range Fleet {
		parts = append(parts, strings.Join(s, ","))
	}
	return fmt.Sprintf("%d in-process nodes: %s", len(Fleet)+1, strings.Join(parts, " + "))
}

// config is the Sluice configuration of s; dir holds what it needs (the
// TLS certificate in natsSecure mode).
func (s nodeSpec) config(dir string) (*config.Config, error) {
	r := s.retry
	policy := fmt.Sprintf("{max_attempts: %d, max_elapsed: %s, base_delay: %s, max_delay: %s}",
		r.MaxAttempts, max(s.maxElapsed, r.Max), r.Base, r.Max)
	adaptive := ""
	if s.discover {
		adaptive = ", adaptive: true"
	}
	server, keyEnv := "", ""
	switch s.nats {
	case natsOpen:
		server = "server:\n  nats: {auth: false}\n"
	case natsSecure:
		cert, key, err := natsauth.SelfSigned(dir)
		if err != nil {
			return nil, err
		}
		server = fmt.Sprintf("server:\n  nats: {auth: true, listen_tls: {cert: %q, key: %q}}\n", cert, key)
		keyEnv = ", api_key_env: " + benchKeyEnv
	}
	model := fmt.Sprintf("{name: %s, rpm: %d, tpm: %d, max_concurrency: %d%s}", Model, s.rpm, s.tpm, s.maxConcurrency, adaptive)
	if s.kind == "anthropic" {
		model = fmt.Sprintf("{name: %s, rpm: %d, itpm: %d, otpm: %d, max_concurrency: %d%s}\n    kind: anthropic",
			s.model, s.rpm, s.itpm, s.otpm, s.maxConcurrency, adaptive)
	}
	providers := fmt.Sprintf("  - name: sim\n    base_url: %s\n    models:\n      - %s\n", s.providerURL, model)
	if s.providers != "" {
		providers = s.providers
	}
	return config.Parse(fmt.Appendf(nil, server+`
providers:
%s
tenants:
  - {name: %s%s}
retry:
  interactive: %s
  standard: %s
  batch: %s
%s`, providers, tenant, keyEnv, policy, policy, policy, s.cacheConfig()))
}

// cacheConfig is the configuration's cache block when s caches.
func (s nodeSpec) cacheConfig() string {
	if !s.cache {
		return ""
	}
	return fmt.Sprintf("cache:\n  tenants: {%s: 1h}\n", tenant)
}

// process is one running in-process node.
type process struct {
	services []string
	info     node.Info
	halt     func() error
}

// launch runs a node until its halt is called.
func launch(ctx context.Context, o node.Options) (*process, error) {
	nodeCtx, cancel := context.WithCancel(context.Background())
	ready := make(chan node.Info, 1)
	errc := make(chan error, 1)
	o.OnReady = func(i node.Info) { ready <- i }
	go func() { errc <- node.Run(nodeCtx, o) }()
	var halted bool
	var herr error
	halt := func() error {
		if !halted {
			halted = true
			cancel()
			herr = <-errc
		}
		return herr
	}
	select {
	case info := <-ready:
		return &process{services: o.Services, info: info, halt: halt}, nil
	case err := <-errc:
		halted, herr = true, err
		cancel()
		return nil, fmt.Errorf("start sluice %s: %w", strings.Join(o.Services, ","), err)
	case <-ctx.Done():
		_ = halt()
		return nil, ctx.Err()
	}
}

// meshNode is a running in-process Sluice: a first node embedding NATS on a
// free loopback port (a fresh store in a temp directory) with every
// service, any processes joining it, HTTP off.
type meshNode struct {
	nc    *nats.Conn
	cl    *client.Client
	procs []*process // procs[0] embeds NATS
	stop  func() error
}

// startNode starts a single node with every service.
func startNode(ctx context.Context, s nodeSpec) (*meshNode, error) {
	s.joiners = nil
	return startFleet(ctx, s)
}

// startFleet starts the first node, then s.joiners on its NATS, and
// connects a client to it.
func startFleet(ctx context.Context, s nodeSpec) (*meshNode, error) {
	dir, err := os.MkdirTemp("", "sluice-bench-")
	if err != nil {
		return nil, err
	}
	cfg, err := s.config(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	// The tenant's key, only in natsSecure mode: random per run.
	benchKey := nuid.Next()
	getenv := func(k string) string {
		if k == benchKeyEnv {
			return benchKey
		}
		return s.env[k]
	}
	n := &meshNode{}
	stopAll := func() error {
		if n.nc != nil {
			n.nc.Close()
		}
		var errs []error
		// Joiners first, so none of them is left reconnecting.
		for _, p := range slices.Backward(n.procs) {
			if err := p.halt(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", strings.Join(p.services, ","), err))
			}
		}
		n.procs = nil
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	n.stop = stopAll
	if s.cluster > 1 {
		procs, err := launchCluster(ctx, cfg, dir, s.cluster, getenv, s.log)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		n.procs = procs
		var urls []string
		for _, p := range procs {
			urls = append(urls, p.info.NATSURL)
		}
		nc, err := nats.Connect(strings.Join(urls, ","), nats.Name("sluice bench"), nats.MaxReconnects(-1))
		if err != nil {
			_ = stopAll()
			return nil, fmt.Errorf("connect to sluice: %w", err)
		}
		n.nc = nc
		if n.cl, err = client.New(nc); err != nil {
			_ = stopAll()
			return nil, err
		}
		return n, nil
	}
	first, err := launch(ctx, node.Options{Config: cfg, NATSListen: "127.0.0.1:0", Data: dir, Services: node.AllServices,
		Getenv: getenv, Log: s.log.With("node", 0)})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	n.procs = append(n.procs, first)
	for i, services := range s.joiners {
		p, err := launch(ctx, node.Options{Config: cfg, NATSURL: first.info.NATSURL, Data: dir, Services: services,
			Getenv: getenv, Log: s.log.With("node", i+1)})
		if err != nil {
			_ = stopAll()
			return nil, err
		}
		n.procs = append(n.procs, p)
	}
	opts := first.info.NATSOptions
	if s.nats == natsSecure {
		opts = []nats.Option{client.TenantUser(tenant, benchKey), nats.RootCAs(cfg.Server.NATS.ListenTLS.Cert)}
	}
	nc, err := nats.Connect(first.info.NATSURL, append(opts, nats.Name("sluice bench"))...)
	if err != nil {
		_ = stopAll()
		return nil, fmt.Errorf("connect to sluice: %w", err)
	}
	n.nc = nc
	cl, err := client.New(nc)
	if err != nil {
		_ = stopAll()
		return nil, err
	}
	n.cl = cl
	return n, nil
}

// registries are the nodes' metric registries, first node first.
func (n *meshNode) registries() []*prometheus.Registry {
	var out []*prometheus.Registry
	for _, p := range n.procs {
		out = append(out, p.info.Registry)
	}
	return out
}

// submit hands j to Sluice, waiting out "queue full" refusals.
func (n *meshNode) submit(ctx context.Context, j *job.Job) error {
	for {
		_, err := n.cl.Submit(ctx, j)
		var full *client.QueueFullError
		if errors.Is(err, client.ErrDuplicate) {
			return nil // an earlier attempt was stored
		}
		if !errors.As(err, &full) {
			return err
		}
		if !sleep(ctx, full.RetryAfter) {
			return ctx.Err()
		}
	}
}

// mesh is the sluice strategy: an in-process Sluice fleet, fed through the
// public Go client.
type mesh struct {
	spec nodeSpec
	// every, when set, spaces the submissions (the i-th at every x i),
	// else every job is offered at once.
	every time.Duration
	node  *meshNode
	// metrics is what the fleet's registries said at the run's end, and
	// the limits in effect sampled during it.
	metrics *SluiceMetrics
}

// submitters is how many goroutines hand jobs to Sluice at once.
const submitters = 8

// sampleEvery is how often the sluice lane samples its limits in effect.
const sampleEvery = 5 * time.Second

func (m *mesh) prepare(ctx context.Context, baseURL string) error {
	m.spec.providerURL = baseURL
	n, err := startFleet(ctx, m.spec)
	if err != nil {
		return err
	}
	m.node = n
	return nil
}

func (m *mesh) run(ctx context.Context, jobs []Job, t *tracker) {
	sm := &SluiceMetrics{Nodes: len(m.node.procs)}
	m.metrics = sm
	sampled := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				sm.sample(m.node.registries(), time.Since(t.t0).Seconds())
			case <-stopSampling:
				return
			}
		}
	}()
	defer func() {
		close(stopSampling)
		<-sampled
		sm.finish(m.node.registries(), time.Since(t.t0).Seconds())
	}()

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
		if m.every > 0 && !sleep(ctx, time.Until(t.t0.Add(time.Duration(i)*m.every))) {
			break
		}
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

// launchCluster starts size in-process nodes of one JetStream cluster on
// loopback, together (each waits for a quorum before it is ready), every
// one with every service.
func launchCluster(ctx context.Context, cfg *config.Config, dir string, size int, getenv func(string) string, log *slog.Logger) ([]*process, error) {
	var ls []net.Listener
	for range 2 * size {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	var routes []string
	for i := range size {
		routes = append(routes, "nats://"+ls[size+i].Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	c := *cfg
	c.Server.Replicas = size
	procs := make([]*process, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for i := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			procs[i], errs[i] = launch(ctx, node.Options{Config: &c, NATSListen: ls[i].Addr().String(), Data: filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
				NATSCluster: ls[size+i].Addr().String(), NATSRoutes: routes, NATSName: fmt.Sprintf("n%d", i+1),
				Services: node.AllServices, Getenv: getenv, Log: log.With("node", i)})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, p := range procs {
			if p != nil {
				_ = p.halt()
			}
		}
		return nil, err
	}
	return procs, nil
}
