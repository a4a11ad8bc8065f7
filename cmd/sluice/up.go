package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natsauth"
	"github.com/sluice-dev/sluice/internal/node"
)

// upFlags are the settings of `sluice up`; each also comes from the config
// file's server section and from a SLUICE_* variable (flag > variable > file
// > default).
type upFlags struct {
	config, natsURL, natsListen, http, data, services, logLevel string
	natsCluster, natsRoutes, natsName, natsAdvertise            string
	metrics, tlsCert, tlsKey                                    string
	replicas                                                    int
	open, pprof                                                 bool
	check, probe                                                bool
	sim                                                         string
}

func runUp(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("up", stderr)
	var f upFlags
	fs.StringVar(&f.config, "config", getenv("SLUICE_CONFIG"), "YAML configuration file (SLUICE_CONFIG)")
	fs.StringVar(&f.natsURL, "nats-url", "", "join this NATS server; empty embeds one (SLUICE_NATS_URL)")
	fs.StringVar(&f.natsListen, "nats-listen", "", "the embedded NATS server's address (SLUICE_NATS_LISTEN, default 127.0.0.1:4222)")
	fs.StringVar(&f.natsCluster, "nats-cluster", "", "the embedded NATS server's cluster (route) listener, HOST:PORT: with --nats-routes it joins a JetStream cluster (SLUICE_NATS_CLUSTER)")
	fs.StringVar(&f.natsRoutes, "nats-routes", "", "every cluster node's route URL, nats://HOST:PORT,... (this node's may be among them) (SLUICE_NATS_ROUTES)")
	fs.StringVar(&f.natsName, "nats-name", "", "the embedded NATS server's name, unique in the cluster (SLUICE_NATS_NAME, default sluice-HOST-PORT of --nats-cluster)")
	fs.StringVar(&f.natsAdvertise, "nats-cluster-advertise", "", "the route address other nodes are told to dial for this one, HOST:PORT (behind NAT or a proxy) (SLUICE_NATS_CLUSTER_ADVERTISE, default --nats-cluster)")
	fs.StringVar(&f.http, "http", "", "HTTP API, /healthz and /readyz address (SLUICE_HTTP, default 127.0.0.1:8080); 'off' disables")
	fs.StringVar(&f.data, "data", "", "data directory for the embedded JetStream store (SLUICE_DATA, default ./data)")
	fs.StringVar(&f.services, "services", "", "services to run: all, or some of ingest,admission,executor,result (SLUICE_SERVICES)")
	fs.StringVar(&f.logLevel, "log-level", "", "debug, info, warn or error (SLUICE_LOG_LEVEL, default info)")
	fs.StringVar(&f.metrics, "metrics", "", "serve /metrics on this address, apart from the API (SLUICE_METRICS, default "+config.DefaultMetrics+"); 'off' disables")
	fs.StringVar(&f.tlsCert, "http-tls-cert", "", "PEM certificate for HTTPS on --http and --metrics (SLUICE_HTTP_TLS_CERT)")
	fs.StringVar(&f.tlsKey, "http-tls-key", "", "PEM private key for --http-tls-cert (SLUICE_HTTP_TLS_KEY)")
	fs.BoolVar(&f.pprof, "pprof", false, "also serve Go's profiler, /debug/pprof/, on the metrics listener (SLUICE_PPROF=1)")
	fs.BoolVar(&f.open, "open", false, "development mode: serve HTTP requests without an API key (SLUICE_OPEN=1); without it, no tenant keys means no start")
	fs.IntVar(&f.replicas, "replicas", 0, "stream and bucket replicas when joining a cluster (SLUICE_REPLICAS, default 1)")
	fs.StringVar(&f.sim, "sim", "", "also run the provider simulator in this process on HOST:PORT, serving the models of the providers whose base_url points there (development and the image's example; not a SLUICE_ variable nor a server: key)")
	fs.BoolVar(&f.check, "check", false, "check the configuration and what it needs (key variables, a writable data directory), name every problem, and exit")
	fs.BoolVar(&f.probe, "probe", false, "with --check: make one cheap authenticated call to each provider (its model list) and report each deployment")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if f.probe && !f.check {
		return errors.New("--probe goes with --check")
	}
	if f.config == "" {
		return errNoConfig()
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	cfg, problems, hash, err := f.resolve(set, f.check, getenv)
	if err != nil {
		return err
	}
	s := &cfg.Server
	routes, err := clusterRoutes(s)
	if err != nil {
		return err
	}
	services, err := node.ParseServices(s.Services)
	if err != nil {
		return fmt.Errorf("--services: %w", err)
	}
	log, err := newLogger(stderr, s.LogLevel)
	if err != nil {
		return err
	}
	if f.sim != "" {
		if _, err := simModels(cfg, f.sim); err != nil {
			return err
		}
	}
	if f.check {
		return reportCheck(ctx, stdout, f.config, cfg, problems, services, getenv, f.probe)
	}
	if len(cfg.Providers) == 0 {
		log.Warn("no providers configured: jobs will be refused with unknown_model (see docs/CONFIG.md)")
	}
	if f.sim != "" {
		stop, err := startSim(f.sim, cfg, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	httpAddr := s.HTTP
	if httpAddr == "off" {
		httpAddr = ""
	}
	reloads := make(chan string, 1)
	defer followSignals(ctx, log, reloads)() // signals.go
	return node.Run(ctx, node.Options{
		Load: func() (*config.Config, string, error) {
			c, _, hash, err := f.resolve(set, false, getenv)
			if err == nil {
				_, err = clusterRoutes(&c.Server) // its defaults, as at start
			}
			return c, hash, err
		},
		ConfigHash: hash, ReloadRequests: reloads,
		Config: cfg, NATSURL: s.NATSURL, NATSListen: s.NATSListen, HTTP: httpAddr, Data: s.Data,
		NATSCluster: s.NATSCluster, NATSRoutes: routes, NATSName: s.NATSName, NATSClusterAdvertise: s.NATSClusterAdvertise,
		Services: services, Getenv: getenv, Log: log,
		OnReady: func(i node.Info) {
			fmt.Fprintf(stdout, "sluice up: nats %s, http %s, services %v", natsauth.RedactURL(i.NATSURL), orNone(i.HTTPAddr), services)
			if i.MetricsAddr != "" {
				fmt.Fprintf(stdout, ", metrics %s", i.MetricsAddr)
			}
			fmt.Fprintln(stdout)
		},
	})
}

// resolve loads the configuration file and puts the flags and SLUICE_*
// variables over its server section (flag > variable > file > default):
// at start, and again at each reload. hash is config.Hash of the file.
func (f upFlags) resolve(set map[string]bool, check bool, getenv func(string) string) (*config.Config, config.Problems, string, error) {
	cfg, problems, hash, err := loadConfig(f.config, check, getenv)
	if err != nil {
		return nil, nil, "", err
	}
	s := &cfg.Server
	pick := func(name, env string, flagVal string, file *string, def string) {
		switch {
		case set[name]:
			*file = flagVal
		case getenv(env) != "":
			*file = getenv(env)
		case *file == "":
			*file = def
		}
	}
	pick("nats-url", "SLUICE_NATS_URL", f.natsURL, &s.NATSURL, "")
	pick("nats-listen", "SLUICE_NATS_LISTEN", f.natsListen, &s.NATSListen, "127.0.0.1:4222")
	pick("nats-cluster", "SLUICE_NATS_CLUSTER", f.natsCluster, &s.NATSCluster, "")
	pick("nats-routes", "SLUICE_NATS_ROUTES", f.natsRoutes, &s.NATSRoutes, "")
	pick("nats-name", "SLUICE_NATS_NAME", f.natsName, &s.NATSName, "")
	pick("nats-cluster-advertise", "SLUICE_NATS_CLUSTER_ADVERTISE", f.natsAdvertise, &s.NATSClusterAdvertise, "")
	pick("http", "SLUICE_HTTP", f.http, &s.HTTP, "127.0.0.1:8080")
	pick("data", "SLUICE_DATA", f.data, &s.Data, "./data")
	pick("services", "SLUICE_SERVICES", f.services, &s.Services, "all")
	pick("log-level", "SLUICE_LOG_LEVEL", f.logLevel, &s.LogLevel, "info")
	pick("metrics", "SLUICE_METRICS", f.metrics, &s.Metrics, config.DefaultMetrics)
	pick("http-tls-cert", "SLUICE_HTTP_TLS_CERT", f.tlsCert, &s.HTTPTLS.Cert, "")
	pick("http-tls-key", "SLUICE_HTTP_TLS_KEY", f.tlsKey, &s.HTTPTLS.Key, "")
	for _, b := range []struct {
		flag, env string
		flagVal   bool
		file      *bool
	}{{"open", "SLUICE_OPEN", f.open, &s.Open}, {"pprof", "SLUICE_PPROF", f.pprof, &s.Pprof}} {
		switch {
		case set[b.flag]:
			*b.file = b.flagVal
		case getenv(b.env) != "":
			v, err := strconv.ParseBool(getenv(b.env))
			if err != nil {
				return nil, nil, "", fmt.Errorf("%s: want 1 or 0 (true or false), got %q", b.env, getenv(b.env))
			}
			*b.file = v
		}
	}
	if t := s.HTTPTLS; t.Enabled() && (t.Cert == "" || t.Key == "") {
		return nil, nil, "", fmt.Errorf("HTTPS needs both --http-tls-cert and --http-tls-key (server.http_tls.cert and .key)")
	}
	switch {
	case set["replicas"]:
		s.Replicas = f.replicas
	case getenv("SLUICE_REPLICAS") != "":
		n, err := strconv.Atoi(getenv("SLUICE_REPLICAS"))
		if err != nil || n < 1 || n > 5 {
			return nil, nil, "", fmt.Errorf("SLUICE_REPLICAS: want 1 to 5, got %q", getenv("SLUICE_REPLICAS"))
		}
		s.Replicas = n
	}
	if s.Replicas < 0 || s.Replicas > 5 {
		return nil, nil, "", fmt.Errorf("--replicas: want 1 to 5, got %d", s.Replicas)
	}
	return cfg, problems, hash, nil
}

// clusterRoutes checks the cluster settings and splits the route list.
// A cluster node gets a default name from its cluster address, which is
// unique among the nodes.
func clusterRoutes(s *config.Server) ([]string, error) {
	if s.NATSCluster == "" {
		if s.NATSRoutes != "" || s.NATSName != "" || s.NATSClusterAdvertise != "" {
			return nil, errors.New("--nats-routes, --nats-name and --nats-cluster-advertise need --nats-cluster (server.nats_cluster), the cluster listener")
		}
		return nil, nil
	}
	if s.NATSURL != "" {
		return nil, errors.New("--nats-cluster makes the embedded server a cluster node; with --nats-url there is no embedded server")
	}
	host, port, err := net.SplitHostPort(s.NATSCluster)
	if err != nil {
		return nil, fmt.Errorf("--nats-cluster %q: want HOST:PORT", s.NATSCluster)
	}
	if s.NATSName == "" {
		s.NATSName = "sluice-" + host + "-" + port
	}
	var routes []string
	for _, r := range strings.Split(s.NATSRoutes, ",") {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		u, err := url.Parse(r)
		if err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "nats-route") {
			return nil, fmt.Errorf("--nats-routes: %q: want nats://HOST:PORT", natsauth.RedactURL(r))
		}
		routes = append(routes, r)
	}
	if len(routes) == 0 {
		return nil, errors.New("--nats-cluster needs --nats-routes (server.nats_routes): the other nodes' cluster URLs")
	}
	return routes, nil
}

// redactURL hides credentials in a URL: a password ("nats://user:xxxxx@host")
// or a token in the user position ("nats://xxxxx@host").
func orNone(s string) string {
	if s == "" {
		return "off"
	}
	return s
}
