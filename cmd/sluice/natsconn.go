package main

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/natsauth"
)

// cliNATS is how a CLI command (queue, submit, dlq) reaches NATS: the URL,
// and the operator's identity found as `sluice up` keeps it: server.nats in
// the configuration (and SLUICE_NATS_* variables), else the operator's nkey
// in <data>/secrets/nats-users.json.
type cliNATS struct {
	url, config, data *string
	getenv            func(string) string
}

// addCLINATS defines --nats-url, --data and, unless the command has its
// own, --config. Defaults come from the environment after parsing, so -h
// never prints a URL that may hold credentials.
func addCLINATS(fs *flag.FlagSet, getenv func(string) string, cfgPath *string) *cliNATS {
	c := &cliNATS{getenv: getenv, config: cfgPath}
	c.url = fs.String("nats-url", "", "NATS server (SLUICE_NATS_URL, else the configuration's server.nats_url or server.nats_listen, else nats://127.0.0.1:4222)")
	c.data = fs.String("data", "", "data directory of the embedded server, where the operator's NATS identity is (SLUICE_DATA, default ./data)")
	if cfgPath == nil {
		c.config = fs.String("config", "", "configuration, for server.nats (SLUICE_CONFIG)")
	}
	return c
}

// connect opens the connection; the config is nil without --config.
func (c *cliNATS) connect(name string) (*nats.Conn, *config.Config, error) {
	path := *c.config
	if path == "" {
		path = c.getenv("SLUICE_CONFIG")
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, nil, err
	}
	url := envOr(c.getenv, "SLUICE_NATS_URL", cfg.Server.NATSURL)
	if *c.url != "" {
		url = *c.url
	}
	embedded := url == ""
	if listen := envOr(c.getenv, "SLUICE_NATS_LISTEN", cfg.Server.NATSListen); url == "" && listen != "" {
		url = "nats://" + listen // the embedded server `sluice up` runs with this file
		if cfg.Server.NATS.ListenTLS.Cert != "" {
			url = "tls://" + listen
		}
	}
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	data := envOr(c.getenv, "SLUICE_DATA", cfg.Server.Data)
	if *c.data != "" {
		data = *c.data
	}
	if data == "" {
		data = "./data"
	}
	opts, ident, err := natsauth.Conn{Config: cfg, DataDir: data, Getenv: c.getenv, Set: natsauth.Operator, Embedded: embedded}.Options()
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(url, append(opts, nats.Name(name), nats.Timeout(5*time.Second))...)
	if err != nil {
		hint := ""
		if errors.Is(err, nats.ErrAuthorization) && ident.Method == "none" {
			hint = fmt.Sprintf(" (no NATS identity found: give --data, the data directory of `sluice up` holding %s, or server.nats in --config)", natsauth.SecretsFile)
		}
		return nil, nil, fmt.Errorf("connect %s as %s: %w%s", natsauth.RedactURL(url), ident, err, hint)
	}
	if *c.config == "" && c.getenv("SLUICE_CONFIG") == "" {
		cfg = nil
	}
	return nc, cfg, nil
}
