package config

// Batches bounds each tenant's share of callers' own batches
// (services/batches, the OpenAI Batch API: /v1/files and /v1/batches).
type Batches struct {
	// MaxFileBytes bounds one uploaded file (default 100 MiB; OpenAI's
	// own bound is 200 MB).
	MaxFileBytes int64 `yaml:"max_file_bytes"`
	// MaxFilesPerTenant bounds the files a tenant holds (uploaded; a
	// batch's output and error files are not counted) (default 100).
	MaxFilesPerTenant int `yaml:"max_files_per_tenant"`
	// MaxBatchesPerTenant bounds a tenant's batches not yet ended
	// (default 10).
	MaxBatchesPerTenant int `yaml:"max_batches_per_tenant"`
}

// Defaults of batches.*.
const (
	DefaultMaxFileBytes        = 100 << 20
	DefaultMaxFilesPerTenant   = 100
	DefaultMaxBatchesPerTenant = 10
)

func (b *Batches) withDefaults() {
	if b.MaxFileBytes == 0 {
		b.MaxFileBytes = DefaultMaxFileBytes
	}
	if b.MaxFilesPerTenant == 0 {
		b.MaxFilesPerTenant = DefaultMaxFilesPerTenant
	}
	if b.MaxBatchesPerTenant == 0 {
		b.MaxBatchesPerTenant = DefaultMaxBatchesPerTenant
	}
}

// checkBatches checks batches.*.
func (c *Config) checkBatches(fail failFunc) {
	b := c.Batches
	if b.MaxFileBytes < 1024 || b.MaxFileBytes > 1<<30 {
		fail("batches.max_file_bytes", "must be 1024 to 1073741824 (1 GiB), got %d", b.MaxFileBytes)
	}
	if b.MaxFilesPerTenant < 1 {
		fail("batches.max_files_per_tenant", "must be positive, got %d", b.MaxFilesPerTenant)
	}
	if b.MaxBatchesPerTenant < 1 {
		fail("batches.max_batches_per_tenant", "must be positive, got %d", b.MaxBatchesPerTenant)
	}
}
