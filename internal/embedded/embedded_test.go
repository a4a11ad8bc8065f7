package embedded_test

import (
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
