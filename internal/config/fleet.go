package config

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// FleetKey is where a node publishes its configuration's limits in the
// fleet bucket (streams.BucketFleet), for tools that run without the
// configuration (`sluice queue`): FleetLimits, read back with Parse.
const FleetKey = "limits"

// FleetLimits is c without its server section (listeners, NATS, TLS
// files): providers and models with their limits, tenants with theirs
// (their keys' variable names only, never a key), admission, routes,
// queues, retry and streaming settings, as YAML that Parse reads.
func FleetLimits(c *Config) ([]byte, error) {
	out := *c
	out.Server = Server{}
	data, err := yaml.Marshal(&out)
	if err != nil {
		return nil, fmt.Errorf("marshal fleet limits: %w", err)
	}
	return data, nil
}
