package executor

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/provider"
)

// What the executor derives from the configuration, kept in step with a
// reload: a provider's client (remade when its address, kind or key
// variable changes), the routes, and the concurrency pools of tenants and
// models (a changed limit is set on the pool, a new tenant or deployment
// gets one). Calls in flight keep what they took.

// clientSet owns which client calls a provider: one per provider, made
// again when the settings it was made from change.
type clientSet struct {
	*env
	mu sync.Mutex
	by map[string]clientEntry
}

type clientEntry struct {
	def string
	c   provider.Client
}

// client returns provider name's client under the configuration in
// effect (nil: not configured).
func (s *clientSet) client(name string) provider.Client {
	if c, ok := s.cfg.Clients[name]; ok {
		return c
	}
	p, ok := s.app().Provider(name)
	if !ok {
		return nil
	}
	def := fmt.Sprint(p.Kind, "|", p.BaseURL, "|", p.APIKeyEnv, "|", p.APIVersion, "|", p.NativeResponses(), "|", s.cfg.Getenv(p.APIKeyEnv))
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.by[name]; ok && e.def == def {
		return e.c
	}
	c := s.newClient(p)
	s.by[name] = clientEntry{def: def, c: c}
	return c
}

// newClient makes p's client.
func (s *clientSet) newClient(p *config.Provider) provider.Client {
	key := ""
	if p.APIKeyEnv != "" {
		key = s.cfg.Getenv(p.APIKeyEnv)
	}
	maxResp := s.app().Limits.MaxResponseBytes
	switch p.Kind {
	case "anthropic":
		return provider.NewAnthropic(provider.AnthropicConfig{BaseURL: p.BaseURL, APIKey: key, Transport: s.cfg.Transport, MaxResponseBytes: maxResp})
	case config.KindAzure:
		return provider.NewAzure(provider.AzureConfig{BaseURL: p.BaseURL, APIKey: key, APIVersion: p.APIVersion, Transport: s.cfg.Transport, MaxResponseBytes: maxResp})
	default:
		return provider.NewOpenAI(provider.OpenAIConfig{BaseURL: p.BaseURL, APIKey: key, Transport: s.cfg.Transport, MaxResponseBytes: maxResp,
			Responses: p.NativeResponses()})
	}
}

// tenantPools owns the fleet-wide concurrency pools of tenants with a
// concurrency limit, kept in step with reloads.
type tenantPools struct {
	*env
	poolMu      sync.Mutex
	tenantPools map[string]*budget.Pool
}

// tenantPool returns tenant's concurrency pool (nil: no limit now).
func (s *tenantPools) tenantPool(tenant string) *budget.Pool {
	t, ok := s.app().Tenant(tenant)
	if !ok || t.MaxConcurrency <= 0 {
		return nil
	}
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	return s.tenantPools[tenant]
}

// each calls f with every pool, under the pools' lock.
func (s *tenantPools) each(f func(*budget.Pool)) {
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	for _, tp := range s.tenantPools {
		f(tp)
	}
}

// syncPools makes the pools of tenants with a concurrency limit that have
// none and sets the limits of the others, starting new ones with start.
func (s *tenantPools) syncTenantPools(start func(*budget.Pool)) {
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	for _, t := range s.app().Tenants {
		if t.MaxConcurrency <= 0 {
			continue
		}
		if p := s.tenantPools[t.Name]; p != nil {
			p.SetLimit(t.MaxConcurrency)
			continue
		}
		p := budget.NewPool(s.mesh.Budgets, keys.TenantConc(t.Name), s.holder, t.MaxConcurrency, 10*time.Second, s.now)
		s.tenantPools[t.Name] = p
		if start != nil {
			start(p)
		}
	}
}

// followReloads applies each reload after next until ctx ends: new
// tenants' and deployments' pools and consumers, changed limits (sync).
func (s *Service) followReloads(ctx context.Context, next <-chan struct{}, sync func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-next:
			next = s.nextReload()
			sync()
		}
	}
}

// modelLoop is one deployment's DISPATCH consumer and concurrency pool.
type modelLoop struct {
	loop *mesh.Loop
	pool *budget.Pool
}

// modelLoops are the deployments this process consumes, by provider/model.
type modelLoops struct {
	mu sync.Mutex
	by map[string]*modelLoop
}

func (m *modelLoops) stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.by {
		l.loop.Stop()
	}
}

// syncModels consumes the deployments of the configuration in effect
// that it does not yet and sets the concurrency limits of the others. A
// deployment a reload removed is still consumed: its jobs in flight end
// as any job of an unknown model does.
func (s *Service) syncModels(ctx, leaseCtx context.Context, wg *sync.WaitGroup, calls *callGroup, models *modelLoops) error {
	models.mu.Lock()
	defer models.mu.Unlock()
	for _, p := range s.app().Providers {
		for i := range p.Models {
			m := &p.Models[i]
			k := p.Name + "/" + m.Name
			if l, ok := models.by[k]; ok {
				l.pool.SetLimit(m.MaxConcurrency)
				continue
			}
			l, err := s.consumeModel(ctx, leaseCtx, wg, calls, p.Name, m)
			if err != nil {
				return err
			}
			models.by[k] = l
		}
	}
	return nil
}
