// Package lane runs the batch lane's collectors: for each deployment
// whose model has the lane enabled (config providers[].models[].batch),
// the one process of the fleet that holds the deployment's lease gathers
// the jobs admission sent to LANE, submits them as one batch to the
// provider's Batch API, follows it, and maps every line back to its job:
// a result (lane batch, at the batch price), a retry or failure as a
// synchronous call's error would have, or the normal lane. A batch not
// done rescue before its earliest deadline is cancelled, the cancellation
// awaited, and only then is what it did not finish sent to the normal
// lane. docs/CONFIG.md, "The batch lane"; docs/OPERATIONS.md.
//
// [Service] runs one collector per deployment; a collector (collector.go)
// owns whether this process works the lane (its lease, lease.go) and the
// order of each turn, and wires small types over a shared env, each the
// one owner of a decision:
//
//   - gatherer (collector.go): the LANE messages held here, each sorted
//     as it arrives, kept alive, and the jobs not yet in a batch;
//   - submitter (submit.go): when a batch goes and which jobs it takes,
//     its record and sent marks before the create call, the create's
//     answer, and taking back a batch that never ran;
//   - follower (follow.go): an open batch's course: a lost create
//     resolved, polls, rescue, and its lines mapped back;
//   - finisher (finish.go): a line's end, decided as a synchronous call's
//     would be and acted on through mesh.Finish or mesh.Requeue;
//   - records (record.go): the batch records and the open batches;
//   - laneBudget (record.go): the lane's share of the provider's batch
//     limit.
package lane

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/metrics"
	"github.com/sluice-dev/sluice/internal/provider"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Config is what the lane needs beyond the mesh.
type Config struct {
	App  *config.Config
	Live *config.Live // nil: App for good
	// Getenv reads the providers' API keys.
	Getenv func(string) string
	// Transport carries the provider calls (nil: the default).
	Transport http.RoundTripper
	// Clients overrides the provider clients by provider name (tests).
	Clients map[string]provider.Client
	// Holder names this process in the lanes' leases ("": host, pid and
	// a random part).
	Holder string
}

// Service runs one collector per deployment with its lane enabled.
type Service struct {
	cfg Config
	m   *mesh.Mesh
	log *slog.Logger
	ms  *metrics.Set
	now func() time.Time
}

// New makes the service; it does no I/O.
func New(cfg Config, m *mesh.Mesh, log *slog.Logger, ms *metrics.Set) (*Service, error) {
	if cfg.App == nil {
		return nil, fmt.Errorf("lane: no configuration")
	}
	if cfg.Getenv == nil {
		cfg.Getenv = func(string) string { return "" }
	}
	if cfg.Holder == "" {
		host, _ := os.Hostname()
		cfg.Holder = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), job.NewID()[24:])
	}
	return &Service{cfg: cfg, m: m, log: log, ms: ms, now: time.Now}, nil
}

// Enabled reports whether c enables the lane of any model.
func Enabled(c *config.Config) bool {
	for _, p := range c.Providers {
		for _, m := range p.Models {
			if _, ok := m.Lane(); ok {
				return true
			}
		}
	}
	return false
}

func (s *Service) app() *config.Config { return s.cfg.Live.Or(s.cfg.App) }

// Run runs the collectors until ctx ends. It hands nothing over: a
// stopped process's leases lapse and its LANE messages are redelivered
// to the process that takes them (that is also what a crash does).
func (s *Service) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, p := range s.app().Providers {
		for _, md := range p.Models {
			l, ok := md.Lane()
			if !ok {
				continue
			}
			c, err := s.newCollector(ctx, p, md, l)
			if err != nil {
				return err
			}
			wg.Go(func() { c.run(ctx) })
		}
	}
	wg.Wait()
	return nil
}

// client makes provider p's batch client.
func (s *Service) client(p config.Provider, l config.BatchLane) (provider.BatchClient, error) {
	var c provider.Client
	if cl, ok := s.cfg.Clients[p.Name]; ok {
		c = cl
	} else {
		key := ""
		if p.APIKeyEnv != "" {
			key = s.cfg.Getenv(p.APIKeyEnv)
		}
		maxResp := s.app().Limits.MaxResponseBytes
		switch p.Kind {
		case "anthropic":
			c = provider.NewAnthropic(provider.AnthropicConfig{BaseURL: p.BaseURL, APIKey: key, Transport: s.cfg.Transport, MaxResponseBytes: maxResp})
		case config.KindAzure:
			c = provider.NewAzure(provider.AzureConfig{BaseURL: p.BaseURL, APIKey: key, APIVersion: p.APIVersion, Transport: s.cfg.Transport, MaxResponseBytes: maxResp})
		default:
			c = provider.NewOpenAI(provider.OpenAIConfig{BaseURL: p.BaseURL, APIKey: key, Transport: s.cfg.Transport, MaxResponseBytes: maxResp})
		}
	}
	bc, ok := provider.BatchesOf(c, provider.BatchLimits{MaxRequests: l.MaxLines})
	if !ok {
		return nil, fmt.Errorf("lane: provider %s (kind %q) has no Batch API", p.Name, p.Kind)
	}
	return bc, nil
}
