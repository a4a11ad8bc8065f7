package ingest

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/pkg/job"
)

// limitView is Sluice's own view of a model's limits for response headers:
// the limits in effect (configured, lowered by what the provider stated or
// what its 429s taught, as admission paces against) and what the fleet's
// shared window holds of the trailing minute. Each model's view is read
// from the budgets bucket at most every limitRefresh.
type limitView struct {
	live  *config.Live
	learn *adapt.Store
	store *budget.Store
	now   func() time.Time
	cache *adapt.Cache[limitSnapshot]
}

// limitRefresh is how stale a model's header view may be.
const limitRefresh = time.Second

type limitSnapshot struct {
	limit, remaining [2]int // by adapt.Requests / adapt.Tokens; limit 0: none
	configured       [2]int
	// state says why limit is what it is: LimitConfigured, LimitWarming or
	// LimitLowered.
	state string
}

// The states X-Sluice-Limit-State names: the limits in effect (the
// x-ratelimit-limit-* headers) are the configured ones, a warm-up's share
// of them (a model with no history starts at half and ramps to whole over
// seconds), or lower ones the provider stated or its 429s taught.
const (
	LimitConfigured = "configured"
	LimitWarming    = "warming"
	LimitLowered    = "lowered"
)

func newLimitView(live *config.Live, m *mesh.Mesh, now func() time.Time) *limitView {
	app := live.Load()
	v := &limitView{live: live, now: now, cache: adapt.NewCache[limitSnapshot](limitRefresh)}
	if m != nil && m.Budgets != nil {
		v.learn = adapt.NewStore(m.Budgets, now)
		v.store = budget.NewStore(m.Budgets, app.Admission.Params(), now)
	}
	return v
}

// get returns the view of provider/model; ok is false for an unknown model.
func (v *limitView) get(ctx context.Context, provider, model string) (limitSnapshot, bool) {
	_, m, found := v.live.Load().Deployment(provider, model)
	if !found {
		return limitSnapshot{}, false
	}
	now := v.now()
	snap, _ := v.cache.Get(provider+"/"+model, now, func(limitSnapshot, bool) (limitSnapshot, error) {
		return v.read(ctx, provider, model, m, now), nil
	})
	return snap, true
}

// read reads a model's view: the configured limits when the learned
// record cannot be read, remaining -1 when the window cannot.
func (v *limitView) read(ctx context.Context, provider, model string, m *config.Model, now time.Time) limitSnapshot {
	snap := limitSnapshot{limit: [2]int{m.RPM, m.TPM}, remaining: [2]int{-1, -1}, configured: [2]int{m.RPM, m.TPM}, state: LimitConfigured}
	if v.learn == nil {
		return snap
	}
	ctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
	defer cancel()
	if st, _, err := v.learn.Get(ctx, adapt.Key(provider, job.ModelToken(model))); err == nil {
		e := adapt.Compute(adapt.For(v.live.Load().Admission, *m), st, now)
		snap.limit = [2]int{e.PerMinute[adapt.Requests], e.PerMinute[adapt.Tokens]}
		switch {
		case e.Ramp < 1:
			snap.state = LimitWarming
		case snap.limit != snap.configured:
			snap.state = LimitLowered
		}
	}
	if used, err := v.store.Used(ctx, budget.ModelKey(provider, job.ModelToken(model))); err == nil {
		snap.remaining = [2]int{max(snap.limit[0]-used.Requests, 0), max(snap.limit[1]-used.Tokens, 0)}
	}
	return snap
}

// set writes OpenAI's x-ratelimit-{limit,remaining}-{requests,tokens} for
// the limited dimensions (the limits in effect), and beside them the
// configured limits and X-Sluice-Limit-State, which says why the two
// differ.
func (snap limitSnapshot) set(h http.Header, prefix func(dim, kind string) string) {
	for d, dim := range []string{"requests", "tokens"} {
		if snap.limit[d] <= 0 {
			continue
		}
		if snap.state != "" {
			h.Set("X-Sluice-Limit-State", snap.state)
		}
		if snap.configured[d] > 0 {
			h.Set("X-Sluice-Ratelimit-Configured-"+dim, strconv.Itoa(snap.configured[d]))
		}
		h.Set(prefix(dim, "limit"), strconv.Itoa(snap.limit[d]))
		if snap.remaining[d] >= 0 {
			h.Set(prefix(dim, "remaining"), strconv.Itoa(snap.remaining[d]))
		}
	}
}

func openAIRateHeader(dim, kind string) string { return "X-Ratelimit-" + kind + "-" + dim }

// resultHeaders sets, on an OpenAI-shaped answer, the provider's request id
// (x-request-id) and Sluice's view of the model's limits
// (x-ratelimit-limit-* and x-ratelimit-remaining-*).
func (s *pipeline) resultHeaders(ctx context.Context, w http.ResponseWriter, res *job.Result) {
	h := w.Header()
	if res.ProviderRequestID != "" {
		h.Set("X-Request-Id", res.ProviderRequestID)
	}
	setDeployment(h, res)
	if snap, ok := s.limits.get(ctx, res.Provider, res.Model); ok {
		snap.set(h, openAIRateHeader)
	}
}

// HeaderDeployment names the deployment (provider/model) that served a
// call, or whose failure ended it.
const HeaderDeployment = "X-Sluice-Deployment"

func setDeployment(h http.Header, res *job.Result) {
	if res.Provider != "" {
		h.Set(HeaderDeployment, res.Provider+"/"+res.Model)
	}
}
