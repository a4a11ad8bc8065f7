// Package batches is OpenAI's Batch API on Sluice's front door: callers
// upload a JSONL file (POST /v1/files, purpose batch), create a batch of
// it (POST /v1/batches), poll it and read its output and error files, as
// the official SDKs' batch workflow does. Each line becomes a job of the
// caller's tenant, priority batch, deadline the batch's completion window,
// accepted through ingest's one accept (limited and accounted like any
// other job); the batch is assembled from the jobs' results.
//
// The owned types:
//   - files: the file records and contents, per tenant (files.go);
//   - the HTTP handlers of files and batches (http.go, create.go), which
//     read, check and record, and never run a batch;
//   - runner: the one owner of a batch's transitions (runner.go): it
//     claims an open batch by a lease on its record, submits its lines,
//     follows its jobs, cancels them when asked and writes its output
//     (output.go). Any process running ingest can take a batch over; its
//     jobs' ids and idempotency keys derive from the batch id and the
//     line's custom_id, so a line submitted twice is one job.
package batches

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/ingest"
	"github.com/sluice-dev/sluice/streams"
)

// Acceptor accepts a job as every other job is accepted
// ((*ingest.Service).Accept).
type Acceptor interface {
	Accept(ctx context.Context, j *task.Task) (ingest.Accepted, error)
}

// Config is what the service needs.
type Config struct {
	App  *config.Config
	Live *config.Live // the configuration in effect; nil: App, fixed
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Holder names this process in a batch's lease.
	Holder string
}

// Service serves the files and batches endpoints and runs the batches
// this process holds.
type Service struct {
	*deps
	files  *files
	runner *runner
}

// deps is what every part reads.
type deps struct {
	cfg    Config
	mesh   *mesh.Mesh
	accept Acceptor
	log    *slog.Logger
	now    func() time.Time

	mu    sync.Mutex
	kv    jetstream.KeyValue    // streams.BucketBatches
	store jetstream.ObjectStore // streams.ObjectFiles
}

// New builds the service; it does no I/O.
func New(cfg Config, m *mesh.Mesh, accept Acceptor, log *slog.Logger) *Service {
	if cfg.Live == nil {
		cfg.Live = config.NewLive(cfg.App)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Holder == "" {
		cfg.Holder = job.NewID()
	}
	d := &deps{cfg: cfg, mesh: m, accept: accept, log: log.With("service", "batches"), now: cfg.Now}
	return &Service{deps: d, files: &files{deps: d}, runner: newRunner(d)}
}

func (d *deps) app() *config.Config { return d.cfg.Live.Load() }

// stores binds the bucket and the object store (once they bind).
func (d *deps) stores(ctx context.Context) (jetstream.KeyValue, jetstream.ObjectStore, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.kv == nil {
		kv, err := d.mesh.JS.KeyValue(ctx, streams.BucketBatches)
		if err != nil {
			return nil, nil, fmt.Errorf("bind bucket %s: %w", streams.BucketBatches, err)
		}
		d.kv = kv
	}
	if d.store == nil {
		st, err := d.mesh.JS.ObjectStore(ctx, streams.ObjectFiles)
		if err != nil {
			return nil, nil, fmt.Errorf("bind object store %s: %w", streams.ObjectFiles, err)
		}
		d.store = st
	}
	return d.kv, d.store, nil
}

// Routes registers the files and batches endpoints on mux.
func (s *Service) Routes(mux *http.ServeMux, auth api.Auth) {
	h := &handlers{deps: s.deps, files: s.files, wake: s.runner.poke}
	for _, rt := range []struct {
		pattern string
		handle  func(http.ResponseWriter, *http.Request, string)
	}{
		{"POST /v1/files", h.upload},
		{"GET /v1/files/{id}", h.getFile},
		{"GET /v1/files/{id}/content", h.content},
		{"DELETE /v1/files/{id}", h.deleteFile},
		{"POST /v1/batches", h.create},
		{"GET /v1/batches", h.list},
		{"GET /v1/batches/{id}", h.getBatch},
		{"POST /v1/batches/{id}/cancel", h.cancel},
	} {
		mux.HandleFunc(rt.pattern, func(w http.ResponseWriter, r *http.Request) {
			r = auth.Scoped(r)
			tenant, err := auth.Tenant(r)
			if err != nil {
				api.AuthError(w, err)
				return
			}
			rt.handle(w, r, tenant)
		})
	}
}

// Run runs the batches this process claims until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return s.runner.run(ctx)
}

// Name names the service in the node's group.
func (s *Service) Name() string { return "batches" }
