// Package natstest starts an embedded NATS server with JetStream, for tests
// (like net/http/httptest) and for `sluice up`'s single-binary default.
package natstest

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Options for Start.
type Options struct {
	Listen   string // host:port; port 0 or -1 picks a free one
	StoreDir string // JetStream file store
	// Configure, when set, adjusts the server options before the server
	// is made: users, nkeys and permissions, TLS.
	Configure func(*server.Options)
}

// Start runs an embedded server and waits until it accepts connections.
func Start(o Options) (*server.Server, error) {
	host, port := "127.0.0.1", -1
	if o.Listen != "" {
		h, p, err := net.SplitHostPort(o.Listen)
		if err != nil {
			return nil, fmt.Errorf("nats listen address %q: %w", o.Listen, err)
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("nats listen port %q: %w", p, err)
		}
		if h != "" {
			host = h
		}
		port = n
		if port == 0 {
			port = -1
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
	if o.Configure != nil {
		o.Configure(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		return nil, errors.New("embedded nats: not ready after 15s (is the port in use?)")
	}
	return s, nil
}

// Server starts a fresh embedded JetStream server on a random loopback port
// with a temporary store, and shuts it down when the test ends.
func Server(t testing.TB) *server.Server {
	t.Helper()
	s, err := Start(Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Conn connects to s and closes the connection when the test ends.
func Conn(t testing.TB, s *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
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
