package executor

import (
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
)

// quarantine owns whether a provider's credential is taken as broken: a
// provider that answered 401/403 is not a fallback for CredentialQuarantine.
type quarantine struct {
	*env
	brokenMu sync.Mutex
	broken   map[string]time.Time // provider -> credential refused until
}

// markBroken records that a provider answered 401/403: its credential is
// treated as broken (primary_unavailable) for CredentialQuarantine.
func (s *quarantine) markBroken(t config.Target) {
	s.brokenMu.Lock()
	defer s.brokenMu.Unlock()
	s.broken[t.Provider] = s.now().Add(CredentialQuarantine)
}

func (s *quarantine) isBroken(t config.Target) bool {
	s.brokenMu.Lock()
	defer s.brokenMu.Unlock()
	return s.now().Before(s.broken[t.Provider])
}

// CredentialQuarantine is how long a provider whose credential was refused
// is treated as unavailable before it is tried again.
const CredentialQuarantine = time.Minute
