package cache

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/pkg/job"
)

// Stats describe the cache bucket.
type Stats struct {
	Entries  uint64         `json:"entries"`
	Bytes    uint64         `json:"bytes"`
	MaxBytes int64          `json:"max_bytes"`
	ByScope  map[string]int `json:"by_scope"` // "tenant acme", "scope shared-docs"
	ByModel  map[string]int `json:"by_model"` // model token
	// Evicts: a full bucket drops its oldest entries for new ones (false:
	// it refuses new ones; made so by an older Sluice, until a start
	// updates it).
	Evicts bool `json:"evicts"`
	// Oldest is when the oldest entry was stored (zero: no entry). Far
	// younger than the TTLs asked for, in a full bucket, it says the bound
	// evicts entries before they expire.
	Oldest time.Time `json:"oldest,omitzero"`
}

// ReadStats counts the bucket's entries by scope and model.
func ReadStats(ctx context.Context, kv jetstream.KeyValue) (*Stats, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("cache bucket: %w", err)
	}
	out := &Stats{Bytes: st.Bytes(), ByScope: map[string]int{}, ByModel: map[string]int{}}
	if s, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		cfg := s.StreamInfo().Config
		out.MaxBytes, out.Evicts = cfg.MaxBytes, cfg.Discard == jetstream.DiscardOld
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes(), jetstream.MetaOnly())
	if err != nil {
		return nil, fmt.Errorf("list cache entries: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		var e jetstream.KeyValueEntry
		select {
		case e = <-w.Updates():
		case <-ctx.Done():
			return nil, fmt.Errorf("list cache entries: %w", ctx.Err())
		}
		if e == nil { // every entry read
			return out, nil
		}
		scope, model, ok := split(e.Key())
		if !ok {
			continue
		}
		out.Entries++
		out.ByScope[scope]++
		out.ByModel[model]++
		if out.Oldest.IsZero() || e.Created().Before(out.Oldest) {
			out.Oldest = e.Created()
		}
	}
}

// Purge removes the entries of tenant ("" every tenant and shared scope)
// for model ("" every model) and returns how many it removed. A tenant's
// purge leaves shared scopes alone.
func Purge(ctx context.Context, kv jetstream.KeyValue, tenant, model string) (int, error) {
	if tenant != "" && !job.ValidName(tenant) {
		return 0, fmt.Errorf("tenant %q: not a tenant name", tenant)
	}
	filter := ">"
	switch {
	case tenant != "" && model != "":
		filter = "t." + tenant + "." + job.ModelToken(model) + ".*"
	case tenant != "":
		filter = "t." + tenant + ".>"
	case model != "":
		filter = "*.*." + job.ModelToken(model) + ".*"
	}
	keys, err := listKeys(ctx, kv, filter)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range keys {
		// Purged, not deleted: the key's history goes, and the marker
		// expires with the bucket's marker TTL.
		if err := kv.Purge(ctx, k, jetstream.PurgeTTL(markerTTL)); err != nil {
			return n, fmt.Errorf("purge %s: %w", k, err)
		}
		n++
	}
	return n, nil
}

// markerTTL is how long a purge marker stays (the bucket's
// limit_marker_ttl allows it).
const markerTTL = time.Minute

func listKeys(ctx context.Context, kv jetstream.KeyValue, filter string) ([]string, error) {
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list cache keys: %w", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, nil
}

// split reads a key: t.<tenant>.<model>.<hash> or s.<scope>.<model>.<hash>.
func split(key string) (scope, model string, ok bool) {
	parts := strings.Split(key, ".")
	if len(parts) != 4 {
		return "", "", false
	}
	switch parts[0] {
	case "t":
		return "tenant " + parts[1], parts[2], true
	case "s":
		return "scope " + parts[1], parts[2], true
	}
	return "", "", false
}
