package node

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/streams"
)

// catchUp is the readiness of a replicated cluster node that embeds a
// server: not ready until this server's replica of every stream and bucket
// is current (or it leads it). A node restarted in a rolling restart says
// ready only once it could take over; restarting the next one before that
// can leave a stream with one current replica of three, and no quorum.
// Once caught up it stays ready (a lagging replica later is JetStream's to
// fix, and not a reason to take the node out of rotation).
type catchUp struct {
	js     jetstream.JetStream
	server string
	done   atomic.Bool
}

// replicated lists what a cluster node holds a replica of: the streams and
// the buckets' streams.
var replicated = []string{streams.Intake, streams.Queue, streams.Dispatch, streams.Results, streams.DLQ,
	"KV_" + streams.BucketBudgets, "KV_" + streams.BucketIdempotency, "KV_" + streams.BucketResults, "KV_" + streams.BucketFleet, streams.Lane}

// Ready reports nil once every replica on this server is current.
func (c *catchUp) Ready() error {
	if c.done.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := lagging(ctx, c.js, c.server); err != nil {
		return err
	}
	c.done.Store(true)
	return nil
}

// lagging returns an error naming the first stream whose replica on
// server is not current, or nil.
func lagging(ctx context.Context, js jetstream.JetStream, server string) error {
	for _, name := range replicated {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // not made yet (its first start): nothing to catch up
		}
		if err != nil {
			return fmt.Errorf("replicas: %s: %w", name, err)
		}
		ci := s.CachedInfo().Cluster
		if ci == nil || ci.Leader == server {
			continue
		}
		if ci.Leader == "" {
			return fmt.Errorf("replicas: %s has no leader yet", name)
		}
		for _, p := range ci.Replicas {
			if p.Name == server && (!p.Current || p.Offline) {
				return fmt.Errorf("replicas: this node's copy of %s is catching up (%d operations behind %s)", name, p.Lag, ci.Leader)
			}
		}
	}
	return nil
}
