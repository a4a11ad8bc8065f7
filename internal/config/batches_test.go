package config_test

import (
	"testing"

	"github.com/sluice-dev/sluice/internal/config"
)

// The batches bounds default when absent, and a bad value is named by key
// and line.
func TestBatchesBounds(t *testing.T) {
	t.Parallel()
	c, ps := config.Check(nil, nil)
	if len(ps) > 0 {
		t.Fatalf("defaults: %v", ps)
	}
	if b := c.Batches; b.MaxFileBytes != config.DefaultMaxFileBytes || b.MaxFilesPerTenant != config.DefaultMaxFilesPerTenant || b.MaxBatchesPerTenant != config.DefaultMaxBatchesPerTenant {
		t.Errorf("defaults: got %+v", b)
	}
	_, ps = config.Check([]byte("batches:\n  max_file_bytes: 10\n  max_files_per_tenant: -1\n  max_batches_per_tenant: -2\n"), nil)
	want := []config.Problem{
		{Key: "batches.max_file_bytes", Line: 2, Msg: "must be 1024 to 1073741824 (1 GiB), got 10"},
		{Key: "batches.max_files_per_tenant", Line: 3, Msg: "must be positive, got -1"},
		{Key: "batches.max_batches_per_tenant", Line: 4, Msg: "must be positive, got -2"},
	}
	if len(ps) != len(want) {
		t.Fatalf("got %v, want %v", ps, want)
	}
	for i := range want {
		if ps[i] != want[i] {
			t.Errorf("problem %d: got %+v, want %+v", i, ps[i], want[i])
		}
	}
}
