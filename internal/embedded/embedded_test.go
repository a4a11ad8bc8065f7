package embedded_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/embedded"
)

func TestCheckStoreDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := embedded.CheckStoreDir(filepath.Join(dir, "data", "jetstream")); err != nil {
		t.Errorf("a store under a writable directory that does not exist yet: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("CheckStoreDir left %d entries behind, want none", len(entries))
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := embedded.CheckStoreDir(filepath.Join(file, "jetstream")); err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Errorf("a store under a file: got %v, want 'is not a directory'", err)
	}
	if os.Getuid() == 0 {
		t.Skip("root writes to read-only directories")
	}
	ro := filepath.Join(dir, "ro")
	if err := os.Mkdir(ro, 0o500); err != nil {
		t.Fatal(err)
	}
	_, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(ro, "jetstream")})
	if err == nil || !strings.Contains(err.Error(), "is not writable") || !strings.Contains(err.Error(), "--data") {
		t.Errorf("Start with a read-only store: got %v, want 'is not writable' naming --data", err)
	}
}

// A listen port another process holds fails the start at once, naming the
// port (the server itself would only fail to become ready, after 15 s);
// an address that is not HOST:PORT is refused before anything starts.
func TestStartNamesAPortInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	_, err = embedded.Start(embedded.Options{Listen: ln.Addr().String(), StoreDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("(port %d)", port)) || !strings.Contains(err.Error(), "another process holds it") {
		t.Errorf("Start on a port in use: got %v, want an error naming port %d", err, port)
	}
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1:4222/x", "nats://127.0.0.1:4222"} {
		if err := embedded.CheckAddr(addr, "listen"); err == nil {
			t.Errorf("CheckAddr(%q): got nil, want refused", addr)
		}
	}
}
