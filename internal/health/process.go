package health

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/breaker"
)

// Beside the fleet's records, a Registry keeps this process's own evidence
// about deployments, and decides from it too:
//
//   - a breaker per deployment (internal/breaker), fed with this process's
//     calls: while it is open, this process does not call the deployment
//     and the fleet's record takes it down (breaker_open) until the
//     breaker's next probe (Take);
//   - a quarantine per provider whose key was refused (a Down whose reason
//     is auth_*): a route does not fall back to it for
//     CredentialQuarantine (CredentialBroken).
//
// Both are per process, as the calls they count are: a breaker's probes
// are this process's calls, and a quarantine outlives the record's down
// by no more than its minute.

// CredentialQuarantine is how long a provider whose credential was refused
// is treated as unavailable before it is tried again.
const CredentialQuarantine = time.Minute

// process is a Registry's per-process evidence.
type process struct {
	breakers *breaker.Set
	brokenMu sync.Mutex
	broken   map[string]time.Time // provider -> credential refused until
}

// Take asks the deployment's breaker for leave to call it, and returns the
// breaker's state after. A nil ticket is a refusal: the breaker is open
// until openUntil, and the deployment is taken down (breaker_open) with no
// probe before then. A ticket must be settled (breaker.Ticket).
func (r *Registry) Take(ctx context.Context, provider, model string) (tk *breaker.Ticket, state breaker.State, openUntil time.Time) {
	br := r.proc.breakers.Get(provider + "/" + model)
	tk, openUntil = br.Take()
	state = br.State()
	if tk == nil {
		if err := r.Down(ctx, provider, model, "breaker_open", openUntil); err != nil {
			r.cfg.Log.Warn("deployment health: down", "provider", provider, "model", model, "err", err)
		}
	}
	return tk, state, openUntil
}

// BreakerOpen reports whether this process's breaker of the deployment is
// open.
func (r *Registry) BreakerOpen(provider, model string) bool {
	return r.proc.breakers.Get(provider+"/"+model).State() == breaker.Open
}

// CredentialBroken reports whether provider's key was refused in this
// process less than CredentialQuarantine ago.
func (r *Registry) CredentialBroken(provider string) bool {
	r.proc.brokenMu.Lock()
	defer r.proc.brokenMu.Unlock()
	return r.cfg.Now().Before(r.proc.broken[provider])
}

// quarantine records, for a down whose reason is a refused key, that
// provider's credential is broken for CredentialQuarantine.
func (r *Registry) quarantine(provider, reason string) {
	if !strings.HasPrefix(reason, "auth_") {
		return
	}
	r.proc.brokenMu.Lock()
	defer r.proc.brokenMu.Unlock()
	r.proc.broken[provider] = r.cfg.Now().Add(CredentialQuarantine)
}

// pause runs the pause effect of a Retry-After: the deployment's dispatch
// held fleet-wide until until (Config.Pause).
func (r *Registry) pause(ctx context.Context, provider, model string, until time.Time) {
	if r.cfg.Pause == nil {
		return
	}
	if err := r.cfg.Pause(ctx, provider, model, until); err != nil {
		r.cfg.Log.Debug("pause", "provider", provider, "model", model, "err", err)
	}
	if r.cfg.Pauses != nil {
		r.cfg.Pauses.WithLabelValues(provider, model).Inc()
	}
}
