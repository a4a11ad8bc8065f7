package systest

import (
	"bytes"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/pkg/sim"
)

// StartSim serves a provider simulator on a loopback port until the test
// ends, and returns it with its base URL.
func StartSim(t testing.TB, cfg sim.Config) (*sim.Server, string) {
	t.Helper()
	s, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts.URL
}

// StartSimOn is StartSim listening on addr.
func StartSimOn(t testing.TB, cfg sim.Config, addr string) (*sim.Server, string) {
	t.Helper()
	s, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s)
	ts.Listener.Close()
	ts.Listener = l
	ts.Start()
	t.Cleanup(ts.Close)
	return s, ts.URL
}

// SimConfig is a Sluice configuration for one simulated provider serving
// model, with the tenants acme, globex and initech (weight 2), and extra
// YAML appended.
func SimConfig(simURL, model string, rpm, tpm int, extra string) string {
	return fmt.Sprintf(`
providers:
  - name: sim
    base_url: %s/v1
    api_key_env: SIM_KEY
    models:
      - {name: %s, rpm: %d, tpm: %d, max_concurrency: 128}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
  - {name: globex, api_key_env: GLOBEX_KEY}
  - {name: initech, api_key_env: INITECH_KEY, weight: 2}
%s`, simURL, model, rpm, tpm, extra)
}

// Env holds the keys SimConfig names: the simulator's (give it
// sim.Config.APIKeys "sim-secret") and the tenants'. SLUICE_METRICS puts
// a `sluice up` process's metrics on a port of its own, so nodes of tests
// running at once do not collide (Start does so by itself). Read it, never
// write it: tests share it.
var Env = map[string]string{"SLUICE_METRICS": "127.0.0.1:0", "SIM_KEY": "sim-secret", "ACME_KEY": "acme-key", "GLOBEX_KEY": "globex-key", "INITECH_KEY": "initech-key"}

// ChatBody is a chat-completions body with a prompt of about words tokens.
func ChatBody(model string, words, maxTokens int) []byte {
	return []byte(fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
		model, maxTokens, strings.TrimSpace(strings.Repeat("lorem ", words))))
}

// SyncBuffer is a log sink several goroutines write.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
