// Package result turns terminal outcomes into what callers read. It consumes
// RESULTS (where each job has at most one result: the stream refuses a
// second, and stored results are republished to sluice.result.<tenant>.<job>
// for subscribers), writes each job's record in the results bucket, settles
// the job's idempotency record, answers jobs that joined the same operation,
// and serves results over HTTP (poll and long-poll).
package result

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	jsonv1 "github.com/go-json-experiment/json/v1"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/internal/api"
	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/internal/tracing"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// Config is what the result service needs.
type Config struct {
	// App is the configuration: its tenants (metric labels) and
	// limits.max_wait and max_waiters_per_tenant (long-polls); nil means
	// the defaults and no tenant labels.
	App *config.Config
	// MaxWait bounds a long-poll; 0 means limits.max_wait.
	MaxWait time.Duration
	// Waiters bounds the long-polls per tenant (shared with ingest); nil
	// makes one from the config.
	Waiters *api.Waiters
	// Live, when set, is the configuration in effect, which a reload
	// replaces (App is then its first value); nil: App, fixed.
	Live *config.Live
}

// Service is the result service.
type Service struct {
	live  *config.Live
	cfg   Config
	mesh  *mesh.Mesh
	log   *slog.Logger
	m     *metrics.Set
	spend *budget.SpendLedger // settles spend holds (finished.go)
}

// New builds the service; it does no I/O.
func New(cfg Config, m *mesh.Mesh, log *slog.Logger, ms *metrics.Set) (*Service, error) {
	if cfg.App == nil {
		app, err := config.Parse(nil)
		if err != nil {
			return nil, err
		}
		cfg.App = app
	}
	if cfg.Live != nil {
		cfg.App = cfg.Live.Load()
	} else if cfg.App != nil {
		cfg.Live = config.NewLive(cfg.App)
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = cfg.App.Limits.MaxWait.D()
	}
	if cfg.Waiters == nil {
		cfg.Waiters = api.NewWaiters(cfg.App.Limits.MaxWaitersPerTenant)
	}
	return &Service{live: cfg.Live, cfg: cfg, mesh: m, log: log.With("service", "result"), m: ms, spend: budget.NewSpendLedger(m.Budgets, nil)}, nil
}

// app is the configuration in effect (cfg.App for a Service built
// without New, in tests).
func (s *Service) app() *config.Config { return s.live.Or(s.cfg.App) }

// Run consumes RESULTS until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	loop, err := s.mesh.Consume(ctx, mesh.Consumer{Stream: streams.Results, Template: "result", What: "results", Batch: 256, Parallel: 32,
		Restarted: s.m.ConsumeRestarted(streams.Results)}, s.log, s.handle)
	if err != nil {
		return err
	}
	<-ctx.Done()
	loop.Drain(10 * time.Second)
	return nil
}

func (s *Service) handle(ctx context.Context, msg jetstream.Msg) (err error) {
	var r job.Result
	if err := jsonv1.Unmarshal(msg.Data(), &r); err != nil || r.JobID == "" {
		s.log.Error("result: undecodable result skipped", "subject", msg.Subject(), "err", err)
		return nil
	}
	ctx, span := s.mesh.Tracing.Start(s.mesh.Tracing.FromMsg(ctx, msg), tracing.SpanResult)
	first := false
	defer func() { endResult(span, &r, first, err) }()
	hints := mesh.Hints(msg.Headers())
	first, err = s.record(ctx, &r, msg.Data(), hints.RecordRev)
	if err != nil {
		return err
	}
	if opKey := msg.Headers().Get(mesh.OpKeyHeader); opKey != "" {
		if err := s.settleOp(ctx, opKey, &r, hints); err != nil {
			return err
		}
	}
	if first {
		s.finished(ctx, &r, hints.Facts) // finished.go
	}
	return nil
}

// tenantLabel is a tenant name for a metric label: only configured names,
// so a forged result cannot add series.
func (s *Service) tenantLabel(name string) string {
	if _, ok := s.app().Tenant(name); ok {
		return name
	}
	return "unknown"
}

// record writes the job's terminal record once; it reports whether this
// call wrote it. hint is the revision at which ingest created the record
// (0: none): a record still at it is the queued record ingest wrote, with
// no result, so the terminal record is written over it by compare-and-set
// without reading it; otherwise the record is read first. raw is r's
// JSON as the result message carried it.
func (s *Service) record(ctx context.Context, r *job.Result, raw []byte, hint uint64) (bool, error) {
	if hint > 0 {
		data := mesh.TerminalRecord(r, raw)
		if _, err := s.mesh.Results.Update(ctx, keys.Record(r.Tenant, r.JobID), data, hint); err == nil {
			return true, nil
		}
		// Changed since (a result already written, a withdrawal), gone, or
		// not known to be written: read it.
	}
	for attempt := 0; attempt < 20; attempt++ {
		rec, rev, err := s.mesh.LookupRecord(ctx, r.Tenant, r.JobID)
		if errors.Is(err, job.ErrNotFound) {
			rec = &mesh.Record{JobID: r.JobID, Tenant: r.Tenant, SubmittedAt: r.SubmittedAt}
		} else if err != nil {
			return false, err
		}
		if rec.Result != nil {
			return false, nil
		}
		rec.Status, rec.Result = r.Status, r
		data, _ := json.Marshal(rec)
		if rev == 0 {
			_, err = s.mesh.Results.Create(ctx, keys.Record(r.Tenant, r.JobID), data)
		} else {
			_, err = s.mesh.Results.Update(ctx, keys.Record(r.Tenant, r.JobID), data, rev)
		}
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
			return false, fmt.Errorf("record result %s: %w", r.JobID, err)
		}
	}
	return false, fmt.Errorf("record result %s: too many conflicts", r.JobID)
}

// settleOp marks the operation done and answers the jobs that joined it.
// With the record the executor wrote (hints.Op at hints.OpRev), checked to
// be this job's in-flight, unjoined, uncancelled operation under opKey, it
// settles it by compare-and-set at that revision without reading it; a
// record that changed since (a joiner, a cancel) is read and updated.
func (s *Service) settleOp(ctx context.Context, opKey string, r *job.Result, hints mesh.ResultHints) error {
	if o := hints.Op; o != nil && o.JobID == r.JobID && o.Tenant == r.Tenant && o.State == mesh.OpInFlight &&
		len(o.Joiners) == 0 && !o.Cancelled {
		if k, _ := mesh.OpKey(o.Tenant, o.Key, ""); k == opKey && settle(o, r) {
			if _, err := s.mesh.PutOpAt(ctx, opKey, o, hints.OpRev); err == nil {
				return nil
			}
		}
	}
	var joiners []string
	op, err := s.mesh.UpdateOp(ctx, opKey, func(o *mesh.OpRecord) bool {
		if o.JobID != r.JobID {
			return false
		}
		joiners = o.Joiners
		return settle(o, r)
	})
	if errors.Is(err, job.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if op.JobID != r.JobID {
		return nil
	}
	for _, id := range joiners {
		if _, err := s.mesh.Finish(ctx, joiner(ctx, s.mesh, r.Tenant, id), mesh.Outcome{Shared: r}, mesh.Exit{}); err != nil {
			return err
		}
	}
	return nil
}

// joiner is the job id of tenant that joined an operation, submitted when
// its record says (unknown when it cannot be read).
func joiner(ctx context.Context, m *mesh.Mesh, tenant, id string) *task.Task {
	t := &task.Task{Job: job.Job{ID: id, Tenant: tenant}}
	if rec, _, err := m.LookupRecord(ctx, tenant, id); err == nil {
		t.SubmittedAt = rec.SubmittedAt
	}
	return t
}

// settle marks o done by r; false when it already is.
func settle(o *mesh.OpRecord, r *job.Result) bool {
	if o.State == mesh.OpCompleted || o.State == mesh.OpFailed {
		return false
	}
	o.State = mesh.OpFailed
	if r.Status == job.StatusSucceeded {
		o.State = mesh.OpCompleted
	}
	o.Usage = r.Usage
	o.ResultRef = job.StoreSubject(r.Tenant, r.JobID)
	return true
}

// Routes registers the result API on mux.
func (s *Service) Routes(mux *http.ServeMux, auth api.Auth) {
	mux.HandleFunc("GET /v1/jobs/{id}", func(w http.ResponseWriter, r *http.Request) { s.get(w, r, auth) })
	mux.HandleFunc("GET /v1/jobs", func(w http.ResponseWriter, r *http.Request) { s.list(w, r, auth) })
	mux.HandleFunc("DELETE /v1/jobs/{id}", func(w http.ResponseWriter, r *http.Request) { s.cancel(w, r, auth) })
	mux.HandleFunc("POST /v1/jobs/{id}/cancel", func(w http.ResponseWriter, r *http.Request) { s.cancel(w, r, auth) })
}

// GET /v1/jobs/{id}[?wait=30s]: the job's status and, once terminal, its
// result. With wait, blocks until the result or the wait ends.
func (s *Service) get(w http.ResponseWriter, r *http.Request, auth api.Auth) {
	tenant, err := auth.Tenant(r)
	if err != nil {
		api.AuthError(w, err)
		return
	}
	id := r.PathValue("id")
	if !job.CanonicalID(id) {
		// Sluice's ids are canonical UUIDs; anything else names no job,
		// and goes no further: the id becomes a KV key and a subject.
		api.Error(w, http.StatusNotFound, "invalid_request_error", "job_not_found", "no such job")
		return
	}
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := api.ParseWait(v, s.cfg.MaxWait, true)
		if err != nil {
			api.Error(w, http.StatusBadRequest, "invalid_request_error", job.CodeInvalidRequest, "wait: "+err.Error())
			return
		}
		wait = d
	}
	if wait > 0 {
		release, ok := s.cfg.Waiters.Acquire(tenant)
		if !ok {
			api.TooManyWaiters(w, s.cfg.Waiters.Max())
			return
		}
		defer release()
	}
	rec, _, err := s.mesh.Lookup(r.Context(), tenant, id)
	if errors.Is(err, job.ErrNotFound) || (err == nil && rec.Tenant != tenant) {
		api.Error(w, http.StatusNotFound, "invalid_request_error", "job_not_found", "no such job")
		return
	}
	if err != nil {
		api.Error(w, http.StatusServiceUnavailable, "sluice_error", "unavailable", "could not read the job")
		return
	}
	s.withStored(r.Context(), rec)
	if rec.Result == nil && wait > 0 {
		api.ExtendDeadlines(w, wait+30*time.Second)
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		if res, err := s.mesh.Wait(ctx, tenant, id); err == nil {
			rec.Result, rec.Status = res, res.Status
		}
	}
	body := map[string]any{"id": rec.JobID, "tenant": rec.Tenant, "status": rec.Status, "submitted_at": rec.SubmittedAt}
	switch {
	case rec.Result != nil:
		body["result"] = rec.Result
	case s.item(r.Context(), rec).Status == job.StatusRunning:
		body["status"] = job.StatusRunning // its call has left: nothing holds it back
	default:
		// The admission process or executor holding the job says why it
		// waits.
		if why, ok := mesh.AskWhy(s.mesh.JS.Conn(), tenant, id, 250*time.Millisecond); ok {
			body["waiting"] = why
		}
	}
	api.JSON(w, http.StatusOK, body)
}

// endResult ends the result span: the job's status and error code, and
// whether this delivery wrote the record (a repeat finds it written).
func endResult(span trace.Span, r *job.Result, first bool, err error) {
	if span.IsRecording() {
		span.SetAttributes(tracing.Status.String(string(r.Status)),
			tracing.Attempt.Int(r.Attempts), tracing.Outcome.String(map[bool]string{true: "recorded", false: "repeat"}[first]))
		if r.Error != nil {
			span.SetAttributes(tracing.ErrorCode.String(r.Error.Code))
		}
		if err != nil {
			span.SetStatus(codes.Error, "will retry")
		}
	}
	span.End()
}
