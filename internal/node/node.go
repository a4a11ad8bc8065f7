// Package node runs a Sluice process: optionally an embedded NATS server,
// the JetStream objects, any subset of the four services, and the HTTP
// server (API, /healthz, /readyz, /metrics). `sluice up`, `sluice demo` and
// the end-to-end tests all start Sluice through Run.
package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/cache"
	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/embedded"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/health"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/natsauth"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/services/batches"
	"github.com/sluice-dev/sluice/services/executor"
	"github.com/sluice-dev/sluice/services/ingest"
	"github.com/sluice-dev/sluice/services/lane"
	"github.com/sluice-dev/sluice/services/result"
	"github.com/sluice-dev/sluice/streams"
)

// AllServices are the services a node runs by default.
var AllServices = []string{"ingest", "admission", "executor", "result"}

// Options configure a node.
type Options struct {
	Config     *config.Config
	NATSURL    string // join this NATS; empty embeds a server
	NATSListen string // the embedded server's address
	// NATSCluster, NATSRoutes and NATSName make the embedded server a
	// node of a JetStream cluster: its route listener, every node's route
	// URL (nats://host:port), and its unique name.
	NATSCluster string
	NATSRoutes  []string
	NATSName    string
	// NATSClusterAdvertise is the route address the other nodes learn
	// for this one; "" is NATSCluster.
	NATSClusterAdvertise string
	HTTP                 string // API address; empty disables HTTP
	Data                 string // data directory (embedded JetStream store)
	Services             []string
	Getenv               func(string) string
	Log                  *slog.Logger
	// Executor overrides executor settings (tests).
	Executor func(*executor.Config)
	// OnReady is called once everything is serving.
	OnReady func(Info)
	// Load re-reads the configuration for a reload (reload.go), resolved
	// as Config was; nil: this process cannot reload. ConfigHash is
	// config.Hash of the file Config came from.
	Load       func() (*config.Config, string, error)
	ConfigHash string
	// ReloadRequests asks for a reload of the fleet, naming why
	// ("SIGHUP"); nil: none come this way.
	ReloadRequests <-chan string
}

// Info describes a running node.
type Info struct {
	NATSURL string
	// NATSOptions connect to NATSURL as the operator (when the node has its
	// identity) and with its TLS settings.
	NATSOptions []nats.Option
	HTTPAddr    string
	// MetricsAddr is the metrics listener's address when server.metrics
	// sets one ("": /metrics is not served).
	MetricsAddr string
	Registry    *prometheus.Registry
	conn        *nats.Conn // the services' connection (tests)
}

// ParseServices checks a comma-separated service list.
func ParseServices(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" || s == "all" {
		return AllServices, nil
	}
	var out []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(AllServices, name) {
			return nil, fmt.Errorf("unknown service %q (want some of %s)", name, strings.Join(AllServices, ","))
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out, nil
}

type runner interface {
	Run(ctx context.Context) error
}

// Run starts the node and blocks until ctx ends or a part fails. It returns
// nil on a requested shutdown. Its steps, in order: fill the options'
// defaults, resolve the HTTP API's keys, start the embedded NATS server
// (unless the node joins one), connect, set up the streams, buckets and
// fleet key, build the services, and run them with the HTTP servers.
func Run(ctx context.Context, o Options) error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	log := o.Log
	// Before anything starts: a node that would serve the API open, or
	// without a tenant's key, does not start at all.
	auth, err := httpAuth(o, log)
	if err != nil {
		return err
	}
	tr, err := tracing.New(ctx, o.Getenv)
	if err != nil {
		return err
	}
	defer flushTraces(tr, log)
	ns, natsURL, err := startNATS(o, log)
	if err != nil {
		return err
	}
	if ns != nil {
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
	}
	c, err := connect(o, ns, natsURL, log)
	if err != nil {
		return err
	}
	defer c.close()
	live := config.NewLive(o.Config)
	st, err := setUp(ctx, o, live, natsURL, c, log)
	if err != nil {
		return err
	}
	st.mesh.Tracing = tr
	reg, ms := newMetrics(o.Config)
	mux := http.NewServeMux()
	services, readiness, err := newServices(o, live, st, c.hints, reg, ms, auth, mux)
	if err != nil {
		return err
	}
	rl := newReloader(o, live, auth, ms, c.nc) // reload.go
	rl.health = st.health
	mux.Handle("POST /admin/reload", rl.adminReload(strings.TrimSpace(o.Getenv(o.Config.Server.OperatorKeyEnv))))
	services = append(services, namedRun{"configuration reloads", rl.run})
	if ns != nil && o.NATSCluster != "" && o.Config.Server.Replicas > 1 {
		readiness = append(readiness, (&catchUp{js: c.js, server: ns.Name()}).Ready)
	}
	mux.Handle("GET /healthz", healthz(c.nc))
	mux.Handle("GET /readyz", readyz(c.nc, readiness))
	mux.Handle("/", api.NotFound(mux))
	return serve(ctx, o, c, natsURL, services, tr.Handler(mux), reg, log)
}

// flushTraces exports the spans still buffered as the node stops.
func flushTraces(tr *tracing.Tracing, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		log.Warn("traces not exported", "err", err)
	}
}

// withDefaults checks o and fills what it leaves out.
func (o Options) withDefaults() (Options, error) {
	if o.Config == nil {
		return o, errors.New("node: no configuration")
	}
	if o.Getenv == nil {
		o.Getenv = func(string) string { return "" }
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	o.Config = withOpenTenant(o.Config)
	if len(o.Services) == 0 {
		o.Services = AllServices
	}
	return o, nil
}

// startNATS starts the embedded server when the node joins none
// (o.NATSURL empty) and returns it with the URL to connect to; a nil
// server means the node joins o.NATSURL. The caller shuts the server down.
func startNATS(o Options, log *slog.Logger) (*server.Server, string, error) {
	if o.NATSURL != "" {
		return nil, o.NATSURL, nil
	}
	if err := checkClusterSecrets(o); err != nil {
		return nil, "", err
	}
	emb, err := natsauth.ForEmbedded(o.Config, o.Data, o.Getenv)
	if err != nil {
		return nil, "", err
	}
	ns, err := embedded.Start(embedded.Options{Listen: o.NATSListen, StoreDir: filepath.Join(o.Data, "jetstream"), Configure: emb.Apply,
		Name: o.NATSName, Cluster: o.NATSCluster, Routes: o.NATSRoutes, Logger: serverLogger(o, log),
		ClusterAdvertise: o.NATSClusterAdvertise})
	if err != nil {
		return nil, "", err
	}
	if o.NATSCluster != "" {
		log.Info("embedded nats: cluster node", "name", ns.Name(), "cluster", ns.ClusterAddr().String(), "routes", natsauth.RedactURL(strings.Join(o.NATSRoutes, ",")))
	}
	natsURL := ns.ClientURL()
	log.Info("embedded nats started", "url", natsURL, "store", filepath.Join(o.Data, "jetstream"),
		"auth", emb.Secrets != nil, "tls", emb.TLS != nil)
	if emb.Secrets == nil && len(o.Config.Tenants) > 0 {
		log.Warn("embedded nats: authentication is off (server.nats.auth: false): anyone who reaches the port reads and changes every tenant's jobs")
	}
	if len(emb.NoKey) > 0 {
		log.Warn("embedded nats: tenants without an API key cannot connect over NATS", "tenants", strings.Join(emb.NoKey, ","))
	}
	return ns, natsURL, nil
}

// link is the services' connection to NATS.
type link struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	closed chan struct{} // closed when the client closes nc for good
	// hints is ingest's connection for wait-hint requests (nil without
	// ingest): tenants publish those, up to a job's size each, so a flood
	// of them fills this connection, never the services' own.
	hints  *nats.Conn
	ident  natsauth.Identity
	opOpts []nats.Option // connect as the operator (ensuring streams, Info)
}

// connect makes the services' connection, with the identity of the
// services the node runs. It connects in the background: setUp waits for
// it.
func connect(o Options, ns *server.Server, natsURL string, log *slog.Logger) (*link, error) {
	set := natsauth.SetName(o.Services)
	// A single embedded node's services reach its server through an
	// in-process pipe: the same authentication and permissions as over
	// TCP, without the loopback socket or TLS on every message (TLS
	// guards the listener, where producers and other processes connect).
	// A cluster node dials its listener, so its connection can move to
	// another node's.
	inProcess := ns != nil && o.NATSCluster == ""
	conn := natsauth.Conn{Config: o.Config, DataDir: o.Data, Getenv: o.Getenv, Set: set, Embedded: ns != nil, InProcess: inProcess}
	authOpts, ident, err := conn.Options()
	if err != nil {
		return nil, err
	}
	if inProcess {
		authOpts = append(authOpts, nats.InProcessServer(ns))
	}
	opConn := conn
	opConn.Set = natsauth.Operator
	opConn.InProcess = false // it dials the listener
	opOpts, _, err := opConn.Options()
	if err != nil {
		return nil, err
	}
	dial := natsURL
	if inProcess {
		// The pipe is never TLS: a tls:// scheme would make the client ask
		// for it.
		dial = "nats://" + strings.TrimPrefix(strings.TrimPrefix(natsURL, "tls://"), "nats://")
	}
	c := &link{closed: make(chan struct{}), ident: ident, opOpts: opOpts}
	c.nc, err = nats.Connect(dial, append(authOpts, nats.Name("sluice "+strings.Join(o.Services, ",")),
		nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.ErrorHandler(natsErrorLogger(log)), nats.ClosedHandler(func(*nats.Conn) { close(c.closed) }))...)
	if err != nil {
		return nil, fmt.Errorf("connect nats %s: %w", natsauth.RedactURL(natsURL), err)
	}
	if c.js, err = jetstream.New(c.nc, jetstream.WithPublishAsyncTimeout(mesh.PublishAckWait)); err != nil {
		c.nc.Close()
		return nil, err
	}
	if slices.Contains(o.Services, "ingest") {
		c.hints, err = nats.Connect(dial, append(authOpts, nats.Name("sluice ingest wait hints"),
			nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true),
			nats.ErrorHandler(natsErrorLogger(log)))...)
		if err != nil {
			c.nc.Close()
			return nil, fmt.Errorf("connect nats %s for wait hints: %w", natsauth.RedactURL(natsURL), err)
		}
	}
	return c, nil
}

// close closes the link's connections.
func (c *link) close() {
	if c.hints != nil {
		c.hints.Close()
	}
	c.nc.Close()
}

// stores are what the services share in JetStream.
type stores struct {
	mesh  *mesh.Mesh
	guard *guard.Guard // nil: only the result service runs, which may not even read the fleet key
	// cache is the response cache's bucket: ingest reads it, the executor
	// stores in it (nil when neither runs).
	cache jetstream.KeyValue
	// health is the deployments' health view (nil when neither admission
	// nor an executor runs); a reload changes its deployments.
	health *health.Registry
}

// setUp waits for the connection, ensures the streams and buckets, opens
// the mesh over them, loads the fleet key and opens the response cache's
// bucket, for the services that need them.
func setUp(ctx context.Context, o Options, live *config.Live, natsURL string, c *link, log *slog.Logger) (*stores, error) {
	// A cluster node may wait for the others to start (a quorum) before
	// it can make or bind the streams.
	setup := 30 * time.Second
	if o.NATSCluster != "" || o.Config.Server.Replicas > 1 {
		setup = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, setup)
	defer cancel()
	if err := waitConnected(ctx, c.nc); err != nil {
		return nil, fmt.Errorf("connect nats %s as %s: %w (last error: %v)", natsauth.RedactURL(natsURL), c.ident, err, c.nc.LastError())
	}
	if err := o.Config.Limits.CheckPayload(c.nc.MaxPayload()); err != nil {
		return nil, err
	}
	if err := ensureStreams(ctx, o, natsURL, c.js, c.ident, c.opOpts, log); err != nil {
		return nil, err
	}
	st := &stores{}
	if err := streams.Retry(ctx, func(ctx context.Context) (err error) {
		st.mesh, err = mesh.Open(ctx, c.js)
		return err
	}); err != nil {
		return nil, err
	}
	if slices.ContainsFunc(o.Services, func(s string) bool { return s != "result" }) {
		var key []byte
		if err := streams.Retry(ctx, func(ctx context.Context) (err error) {
			key, err = guard.LoadKey(ctx, st.mesh.Fleet)
			return err
		}); err != nil {
			return nil, err
		}
		st.guard = guard.NewLive(live, key)
	}
	if slices.Contains(o.Services, "ingest") || slices.Contains(o.Services, "executor") {
		if err := streams.Retry(ctx, func(ctx context.Context) (err error) {
			st.cache, err = cache.Open(ctx, c.js)
			return err
		}); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// newMetrics makes the node's registry and metrics, with the configured
// limits set.
func newMetrics(cfg *config.Config) (*prometheus.Registry, *metrics.Set) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ms := metrics.New(reg)
	setLimitGauges(ms, cfg)
	return reg, ms
}

// setLimitGauges shows cfg's configured limits.
func setLimitGauges(ms *metrics.Set, cfg *config.Config) {
	ms.Preset(cfg)
	for _, p := range cfg.Providers {
		for _, m := range p.Models {
			ms.ModelLimit.WithLabelValues(p.Name, m.Name, "rpm").Set(float64(m.RPM))
			ms.ModelLimit.WithLabelValues(p.Name, m.Name, "tpm").Set(float64(m.TPM))
			ms.ModelLimit.WithLabelValues(p.Name, m.Name, "concurrency").Set(float64(m.MaxConcurrency))
			for name, limit := range m.Units {
				ms.ModelLimit.WithLabelValues(p.Name, m.Name, name+"_per_minute").Set(float64(limit))
			}
		}
	}
}

// namedRun is a function run as a part of the node, under a name.
type namedRun struct {
	name string
	run  func(ctx context.Context) error
}

func (r namedRun) Run(ctx context.Context) error { return r.run(ctx) }
func (r namedRun) Name() string                  { return r.name }

// newServices builds the services o names, in its order, adding their
// routes to mux; readiness are the checks /readyz makes.
func newServices(o Options, live *config.Live, st *stores, hints *nats.Conn, reg prometheus.Registerer, ms *metrics.Set, auth api.Auth, mux *http.ServeMux) (services []runner, readiness []func() error, err error) {
	m, gd := st.mesh, st.guard
	waiters := api.NewWaiters(o.Config.Limits.MaxWaitersPerTenant)
	cal := calib.New(m.Budgets, nil)
	var answers *cache.Cache
	if st.cache != nil {
		answers = cache.New(st.cache, reg, o.Log)
	}
	hr := newHealth(o, m, ms)
	st.health = hr
	var more []runner // after o.Services' (serve names them)
	for _, name := range o.Services {
		switch name {
		case "ingest":
			s, err := ingest.New(ingest.Config{App: o.Config, Live: live, Guard: gd, Waiters: waiters, Cache: answers, Hints: hints}, m, o.Log, ms)
			if err != nil {
				return nil, nil, err
			}
			s.Routes(mux, auth)
			services = append(services, s)
			b := batches.New(batches.Config{App: o.Config, Live: live}, m, s, o.Log) // callers' batches, on ingest's accept
			b.Routes(mux, auth)
			more = append(more, b)
		case "admission":
			s, err := admission.New(admission.Config{App: o.Config, Live: live, Guard: gd, Calib: cal, Health: hr}, m, o.Log, ms)
			if err != nil {
				return nil, nil, err
			}
			readiness = append(readiness, s.Ready)
			services = append(services, s)
		case "executor":
			cfg := executor.Config{App: o.Config, Live: live, Getenv: o.Getenv, Calib: cal, Guard: gd, Cache: answers, Health: hr}
			if o.Executor != nil {
				o.Executor(&cfg)
			}
			s, err := executor.New(cfg, m, o.Log, ms)
			if err != nil {
				return nil, nil, err
			}
			services = append(services, s)
			if lane.Enabled(o.Config) { // the batch lane runs with the executors
				l, err := lane.New(lane.Config{App: o.Config, Live: live, Getenv: o.Getenv, Transport: cfg.Transport, Clients: cfg.Clients}, m, o.Log, ms)
				if err != nil {
					return nil, nil, err
				}
				services = append(services, namedRun{"lane", l.Run})
			}
		case "result":
			s, err := result.New(result.Config{App: o.Config, Live: live, Waiters: waiters}, m, o.Log, ms)
			if err != nil {
				return nil, nil, err
			}
			s.Routes(mux, auth)
			services = append(services, s)
		}
	}
	services = append(services, more...)
	if hr != nil {
		services = append(services, hr) // after o.Services' (serve names them)
		readiness = append(readiness, deploymentsReady(hr))
	}
	return services, readiness, nil
}

// newHealth makes the node's view of the deployments' health when it runs
// a service that reads or writes it (admission, executor); nil otherwise.
func newHealth(o Options, m *mesh.Mesh, ms *metrics.Set) *health.Registry {
	if !slices.Contains(o.Services, "admission") && !slices.Contains(o.Services, "executor") {
		return nil
	}
	host, _ := os.Hostname()
	return health.New(health.Config{KV: m.Budgets, Deployments: deploymentsOf(o.Config), Holder: fmt.Sprintf("%s-%d-%s", host, os.Getpid(), job.NewID()[24:]),
		Log: o.Log, Changes: ms.DeploymentChanges, States: ms.DeploymentState, Pause: m.PauseDispatch, Pauses: ms.Pauses})
}

// deploymentsOf is every provider/model pair c configures.
func deploymentsOf(c *config.Config) []health.Deployment {
	var deps []health.Deployment
	for _, p := range c.Providers {
		for _, md := range p.Models {
			deps = append(deps, health.Deployment{Provider: p.Name, Model: md.Name})
		}
	}
	return deps
}

// degraded is a readiness check's answer that the node serves, but not
// all it could: /readyz answers 200 and says so.
type degraded struct{ why string }

func (d *degraded) Error() string { return d.why }

// deploymentsReady is /readyz's check of the deployments' health: degraded
// while some are down, failing when every one is (no job can be served).
func deploymentsReady(hr *health.Registry) func() error {
	return func() error {
		down, n := hr.DownNow()
		switch {
		case len(down) == 0:
			return nil
		case len(down) == n:
			return fmt.Errorf("unready: every deployment is down: %s", strings.Join(down, ", "))
		}
		return &degraded{why: "deployments down: " + strings.Join(down, ", ")}
	}
}

// readyz answers 200 "ready" when the connection is up and every check
// passes, 200 "degraded: ..." when a check says the node serves less than
// it could (some deployments down), and 503 when a check fails.
func readyz(nc *nats.Conn, readiness []func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !nc.IsConnected() {
			http.Error(w, "nats: not connected", http.StatusServiceUnavailable)
			return
		}
		var notes []string
		for _, ready := range readiness {
			var d *degraded
			if err := ready(); errors.As(err, &d) {
				notes = append(notes, d.why)
			} else if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		if len(notes) > 0 {
			_, _ = w.Write([]byte("degraded: " + strings.Join(notes, "; ") + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
}

// serve runs the services and the HTTP servers in one group until ctx
// ends (nil) or one of them fails or stops (its error). A closed
// connection is a failure. The services get a context of their own, ended
// only once the group stops, so they drain when the node is asked to
// stop, not when ctx ends.
func serve(ctx context.Context, o Options, c *link, natsURL string, services []runner, mux http.Handler, reg *prometheus.Registry, log *slog.Logger) error {
	var g run.Group
	g.Add(run.ContextHandler(ctx))
	connCtx, stopConn := context.WithCancel(ctx)
	defer stopConn()
	g.Add(func() error { return connClosed(connCtx, c.nc, c.closed) }, func(error) { stopConn() })
	svcCtx, stopServices := context.WithCancel(context.Background())
	defer stopServices()
	for i, s := range services {
		name := "deployment health"
		if i < len(o.Services) {
			name = o.Services[i]
		} else if n, ok := s.(interface{ Name() string }); ok {
			name = n.Name()
		}
		g.Add(func() error {
			if err := s.Run(svcCtx); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if svcCtx.Err() == nil {
				return fmt.Errorf("%s: stopped unexpectedly", name)
			}
			return nil
		}, func(error) { stopServices() })
	}
	httpAddr, metricsAddr, err := addHTTP(&g, o, mux, reg, log)
	if err != nil {
		return err
	}
	if o.OnReady != nil {
		o.OnReady(Info{NATSURL: natsURL, NATSOptions: c.opOpts, HTTPAddr: httpAddr, MetricsAddr: metricsAddr, Registry: reg, conn: c.nc})
	}
	log.Info("sluice up", "services", strings.Join(o.Services, ","), "nats", natsauth.RedactURL(natsURL), "nats_identity", c.ident.String())
	if err := g.Run(); !errors.Is(err, ctx.Err()) {
		return err
	}
	return nil
}

// streamOptions are the stream settings a configuration asks for.
func streamOptions(c *config.Config) streams.Options {
	bounds := func(b config.StreamBounds) streams.Bounds {
		return streams.Bounds{MaxMsgs: b.MaxMsgs, MaxBytes: b.MaxBytes, MaxMsgsPerSubject: b.MaxPerTenant}
	}
	return streams.Options{Replicas: c.Server.Replicas, ResultRetention: c.Limits.ResultRetention.D(), StreamReplay: c.Streaming.Replay.D(),
		DLQRetention: c.Limits.DLQRetention.D(), Intake: bounds(c.Queues.Intake), Queue: bounds(c.Queues.Queue),
		JobMsgBytes: int32(c.Limits.JobMsgBytes()), ResultMsgBytes: int32(c.Limits.ResultMsgBytes()),
		CacheBytes: c.Cache.MaxBytes}
}

// ensureStreams creates or updates the JetStream objects, as the operator
// when the node holds the operator's identity (service identities may not
// change streams), else over the node's own connection; with
// server.nats.manage_streams: false it leaves them as they are.
func ensureStreams(ctx context.Context, o Options, natsURL string, js jetstream.JetStream, ident natsauth.Identity, opOpts []nats.Option, log *slog.Logger) error {
	if m := o.Config.Server.NATS.ManageStreams; m != nil && !*m {
		log.Info("streams not managed by this process (server.nats.manage_streams: false)")
		return nil
	}
	if ident.Set != "" && ident.Set != natsauth.Operator {
		nc, err := nats.Connect(natsURL, append(opOpts, nats.Name("sluice ensure streams"))...)
		if err != nil {
			return fmt.Errorf("connect nats %s as operator to ensure streams: %w", natsauth.RedactURL(natsURL), err)
		}
		defer nc.Close()
		if js, err = jetstream.New(nc); err != nil {
			return err
		}
	}
	// Every node of a cluster runs this at start, possibly before the
	// cluster has a quorum: transient errors are retried until ctx ends.
	err := streams.RetryNotify(ctx, func(ctx context.Context) error {
		opt := streamOptions(o.Config)
		opt.Log = log
		if err := streams.Ensure(ctx, js, opt); err != nil {
			return err
		}
		// The fleet key is made here too, with the only identity that
		// may write it: services find it (carried over from the budgets
		// bucket, where an older fleet kept it).
		fleet, err := js.KeyValue(ctx, streams.BucketFleet)
		if err != nil {
			return fmt.Errorf("bind bucket %s: %w", streams.BucketFleet, err)
		}
		budgets, err := js.KeyValue(ctx, streams.BucketBudgets)
		if err != nil {
			return fmt.Errorf("bind bucket %s: %w", streams.BucketBudgets, err)
		}
		if _, err = guard.EnsureKey(ctx, fleet, budgets); err != nil {
			return err
		}
		return publishLimits(ctx, fleet, o.Config)
	}, func(err error) { log.Debug("ensure streams: will retry", "err", err) })
	if err != nil {
		if ident.Method != "none" && errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w (this NATS identity may not be allowed to manage streams: use the operator's, or set server.nats.manage_streams: false once they exist)", err)
		}
		return err
	}
	return nil
}

// checkClusterSecrets refuses to start a cluster node with authentication
// on and no secrets file: each node would make its own service identities
// and route password, the routes would refuse each other, and a service
// reconnecting to another node would be unknown there. Every node must
// hold the same file.
func checkClusterSecrets(o Options) error {
	if o.NATSCluster == "" || !natsauth.AuthOn(o.Config) {
		return nil
	}
	if _, err := natsauth.LoadSecrets(o.Data); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cluster node with NATS authentication: no %s; every node needs the same one: make it once (sluice nats-auth --data DIR > /dev/null) and copy it to each node's data directory, mode 0600", natsauth.SecretsPath(o.Data))
		}
		return err
	}
	return nil
}

// serverLogger passes a cluster node's server log (routes, elections,
// leadership changes) to the node's log: warnings and errors always,
// notices at debug level. A single server logs nothing.
func serverLogger(o Options, log *slog.Logger) server.Logger {
	if o.NATSCluster == "" {
		return nil
	}
	return slogServer{log.With("component", "nats")}
}

type slogServer struct{ log *slog.Logger }

func (l slogServer) Noticef(f string, v ...any) { l.log.Debug(fmt.Sprintf(f, v...)) }
func (l slogServer) Warnf(f string, v ...any) {
	msg := fmt.Sprintf(f, v...)
	if strings.HasPrefix(msg, "Plaintext passwords detected") {
		// The embedded server's users live in memory, made from the
		// environment at start: nothing is in a configuration file.
		l.log.Debug(msg)
		return
	}
	l.log.Warn(msg)
}
func (l slogServer) Fatalf(f string, v ...any) { l.log.Error(fmt.Sprintf(f, v...)) }
func (l slogServer) Errorf(f string, v ...any) { l.log.Error(fmt.Sprintf(f, v...)) }
func (l slogServer) Debugf(f string, v ...any) {}
func (l slogServer) Tracef(f string, v ...any) {}

// natsErrorLogger logs what the NATS server reports asynchronously:
// permission violations name the subject a role was refused.
func natsErrorLogger(log *slog.Logger) nats.ErrHandler {
	return func(_ *nats.Conn, sub *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+mesh.ServiceImportReplyPrefix) {
			// An answer to a tenant's request (a wait hint) sent after its
			// response permission lapsed: late during a flood of requests,
			// long after the tenant stopped waiting. Not an error of Sluice's.
			log.Debug("nats: late answer to a tenant's request dropped", "err", err)
			return
		}
		attrs := []any{"err", err}
		if sub != nil {
			attrs = append(attrs, "subject", sub.Subject)
		}
		log.Error("nats error", attrs...)
	}
}

func waitConnected(ctx context.Context, nc *nats.Conn) error {
	for !nc.IsConnected() {
		select {
		case <-ctx.Done():
			return errors.New("not connected")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
