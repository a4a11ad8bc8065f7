package node

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/config"
)

// publishLimits puts the configuration's limits in the fleet bucket
// (config.FleetKey), where `sluice queue` reads them when it is given no
// configuration. The last node to start (or reload) wins: a fleet runs one
// configuration.
func publishLimits(ctx context.Context, fleet jetstream.KeyValue, c *config.Config) error {
	data, err := config.FleetLimits(c)
	if err != nil {
		return err
	}
	if _, err := fleet.Put(ctx, config.FleetKey, data); err != nil {
		return fmt.Errorf("publish limits: %w", err)
	}
	return nil
}
