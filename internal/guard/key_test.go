package guard_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/meshtest"
	"github.com/sluice-dev/sluice/streams"
)

// TestFleetKeyMigrates: a data directory whose fleet key sits in the
// budgets bucket (as older fleets kept it) keeps it, now in the fleet
// bucket; a legacy key that was overwritten is not carried over; a
// malformed key in the fleet bucket is an error that says what to do.
func TestFleetKeyMigrates(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js := meshtest.JetStream(t, streams.Options{})
	budgets, err := js.KeyValue(ctx, streams.BucketBudgets)
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := js.KeyValue(ctx, streams.BucketFleet)
	if err != nil {
		t.Fatal(err)
	}
	legacy := bytes.Repeat([]byte{7}, 32)
	if _, err := budgets.Put(ctx, guard.LegacyKeyName, legacy); err != nil {
		t.Fatal(err)
	}
	got, err := guard.EnsureKey(ctx, fleet, budgets)
	if err != nil || !bytes.Equal(got, legacy) {
		t.Fatalf("EnsureKey = %x, %v; want the legacy key", got, err)
	}
	if got, err := guard.LoadKey(ctx, fleet); err != nil || !bytes.Equal(got, legacy) {
		t.Errorf("LoadKey after the migration = %x, %v; want the legacy key", got, err)
	}
	// Once migrated, the budgets bucket no longer matters.
	if _, err := budgets.Put(ctx, guard.LegacyKeyName, []byte(`{"retry_after_ms":1000}`)); err != nil {
		t.Fatal(err)
	}
	if got, err := guard.EnsureKey(ctx, fleet, budgets); err != nil || !bytes.Equal(got, legacy) {
		t.Errorf("EnsureKey again = %x, %v; want the migrated key", got, err)
	}

	// A fresh fleet bucket next to an overwritten legacy key: a new key.
	fresh, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "fleet_fresh"})
	if err != nil {
		t.Fatal(err)
	}
	got, err = guard.EnsureKey(ctx, fresh, budgets)
	if err != nil || len(got) != 32 || bytes.Equal(got, legacy) {
		t.Errorf("EnsureKey over an overwritten legacy key = %x, %v; want a new 32-byte key", got, err)
	}

	if _, err := fresh.Put(ctx, guard.KeyName, []byte("short")); err != nil {
		t.Fatal(err)
	}
	if _, err := guard.LoadKey(ctx, fresh); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("LoadKey of a malformed key: %v, want an error saying it is malformed", err)
	}
}
