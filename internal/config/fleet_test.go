package config

import (
	"reflect"
	"strings"
	"testing"
)

// TestFleetLimitsRoundTrip: what a node publishes for `sluice queue` parses
// back to the same limits, and carries no server section.
func TestFleetLimitsRoundTrip(t *testing.T) {
	t.Parallel()
	c, err := Parse([]byte(`
server: {nats_listen: "127.0.0.1:9999"}
providers:
  - name: p
    base_url: http://127.0.0.1:1/v1
    api_key_env: P_KEY
    models:
      - {name: m, rpm: 60, tpm: 6000, max_concurrency: 3, rpd: 100}
tenants:
  - {name: a, api_key_env: A_KEY, rpm: 5, rpd: 50, tpm: 700, tpd: 9000, max_concurrency: 2, weight: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	data, err := FleetLimits(c)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "9999") {
		t.Errorf("fleet limits carry the server section:\n%s", data)
	}
	back, err := Parse(data)
	if err != nil {
		t.Fatalf("parse fleet limits: %v\n%s", err, data)
	}
	_, m, ok := back.ModelRef("m")
	if !ok || m.RPM != 60 || m.TPM != 6000 || m.MaxConcurrency != 3 || m.RPD != 100 {
		t.Errorf("model after the round trip: got %+v", m)
	}
	ten, ok := back.Tenant("a")
	got, want := *ten, c.Tenants[0]
	if len(got.APIKeys) == 0 && len(want.APIKeys) == 0 {
		got.APIKeys, want.APIKeys = nil, nil // none either way
	}
	if !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("tenant after the round trip: got %+v, want %+v", ten, c.Tenants[0])
	}
}
