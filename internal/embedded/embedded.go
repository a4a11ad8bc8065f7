// Package embedded runs the NATS server with JetStream inside the process:
// `sluice up`'s single-binary default and the tests' servers.
package embedded

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options for Start.
type Options struct {
	Listen   string // host:port; port 0 or -1 picks a free one
	StoreDir string // JetStream file store
	// Name is the server's name, unique in a cluster; "" is
	// "sluice-embedded".
	Name string
	// Cluster, when set, is the host:port of the cluster (route) listener:
	// the server joins the JetStream cluster ClusterName (default
	// "sluice") made of the servers at Routes (nats://host:port of each
	// node's cluster listener; its own may be among them).
	Cluster     string
	Routes      []string
	ClusterName string
	// ClusterAdvertise is the route address gossiped to the other nodes;
	// "" is the listener's.
	ClusterAdvertise string
	// Configure, when set, adjusts the server options before the server
	// is made: users, nkeys and permissions, TLS, route credentials.
	Configure func(*server.Options)
	// Logger, when set, receives the server's notices, warnings and
	// errors (debug and trace stay off).
	Logger server.Logger
}

// hostPort splits host:port; port 0 or -1 picks a free one.
func hostPort(addr, what string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("nats %s address %q: %w", what, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("nats %s address %q: the port must be a number from 0 to 65535", what, addr)
	}
	if strings.ContainsAny(h, "/?#@") || strings.Contains(addr, "://") {
		return "", 0, fmt.Errorf("nats %s address %q: want HOST:PORT (no scheme, path or credentials)", what, addr)
	}
	if h == "" {
		h = "127.0.0.1"
	}
	if n == 0 {
		n = -1
	}
	return h, n, nil
}

// CheckAddr checks a listen address as Start reads it (HOST:PORT, the
// port 0 to 65535); what names it in the error ("listen", "cluster").
func CheckAddr(addr, what string) error {
	_, _, err := hostPort(addr, what)
	return err
}

// portFree fails at once, naming the port, when another process holds it:
// the server would only fail to become ready.
func portFree(host string, port int, what string) error {
	if port <= 0 {
		return nil
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("embedded nats: cannot %s on %s (port %d): %w; another process holds it (a running sluice?): choose another port (--nats-listen, server.nats_listen) or stop it", what, addr, port, err)
	}
	return ln.Close()
}

// Start runs an embedded server and waits until it accepts connections.
func Start(o Options) (*server.Server, error) {
	host, port := "127.0.0.1", -1
	if o.Listen != "" {
		var err error
		if host, port, err = hostPort(o.Listen, "listen"); err != nil {
			return nil, err
		}
	}
	if o.StoreDir != "" {
		if err := CheckStoreDir(o.StoreDir); err != nil {
			return nil, fmt.Errorf("embedded nats: %w", err)
		}
	}
	opts := &server.Options{
		ServerName: "sluice-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		NoSigs:     true,
		NoLog:      true,
		MaxPayload: 8 << 20,
	}
	if o.Name != "" {
		opts.ServerName = o.Name
	}
	if o.Cluster != "" {
		h, p, err := hostPort(o.Cluster, "cluster")
		if err != nil {
			return nil, err
		}
		opts.Cluster.Name = o.ClusterName
		if opts.Cluster.Name == "" {
			opts.Cluster.Name = "sluice"
		}
		opts.Cluster.Host, opts.Cluster.Port = h, p
		opts.Cluster.Advertise = o.ClusterAdvertise
		for _, r := range o.Routes {
			u, err := url.Parse(strings.TrimSpace(r))
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("nats route %q: want nats://host:port", r)
			}
			opts.Routes = append(opts.Routes, u)
		}
	} else if len(o.Routes) > 0 {
		return nil, errors.New("nats routes without a cluster listener: give the cluster address too")
	}
	if o.Configure != nil {
		o.Configure(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if o.Logger != nil {
		s.SetLoggerV2(o.Logger, false, false, false)
	}
	if err := portFree(opts.Host, opts.Port, "listen"); err != nil {
		return nil, err
	}
	if opts.Cluster.Port > 0 {
		if err := portFree(opts.Cluster.Host, opts.Cluster.Port, "cluster"); err != nil {
			return nil, err
		}
	}
	go s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		return nil, errors.New("embedded nats: not ready after 15s (is a port in use?)")
	}
	return s, nil
}

// CheckStoreDir reports whether a JetStream store could live in dir: dir, or
// the nearest of its parents that exists (the server creates the rest), must
// be a directory this process can write to. The server itself, given a store
// it cannot write, only fails to become ready.
func CheckStoreDir(dir string) error {
	at := filepath.Clean(dir)
	for {
		fi, err := os.Stat(at)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("store directory %s: %s is not a directory", dir, at)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return fmt.Errorf("store directory %s: %w", dir, err)
		}
		parent := filepath.Dir(at)
		if parent == at {
			return fmt.Errorf("store directory %s: no parent of it exists", dir)
		}
		at = parent
	}
	f, err := os.CreateTemp(at, ".sluice-write-check-*")
	if err != nil {
		return fmt.Errorf("store directory %s is not writable by this process (uid %d): %w; make it writable, or choose another (sluice up: --data or SLUICE_DATA)", dir, os.Getuid(), errors.Unwrap(err))
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}
