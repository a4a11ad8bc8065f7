package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/nats-io/nats.go/jetstream"
)

// LoadMap reads a KV record that holds a JSON map (the prompt-cache
// registry, the affinity table) and its revision: an empty map at revision
// 0 when there is none, and an empty map at the record's revision when it
// is corrupt (it is rewritten, never trusted).
func LoadMap[T any](ctx context.Context, kv KV, key string) (map[string]T, uint64, error) {
	set := map[string]T{}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return set, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%w: get %s: %v", ErrUnavailable, key, err)
	}
	if json.Unmarshal(e.Value(), &set) != nil {
		set = map[string]T{}
	}
	return set, e.Revision(), nil
}

// TrimMap keeps the max entries of set that expire last (expires gives
// an entry's expiry).
func TrimMap[T any](set map[string]T, max int, expires func(T) int64) {
	if len(set) <= max {
		return
	}
	hs := make([]string, 0, len(set))
	for h := range set {
		hs = append(hs, h)
	}
	sort.Slice(hs, func(i, j int) bool { return expires(set[hs[i]]) > expires(set[hs[j]]) })
	for _, h := range hs[max:] {
		delete(set, h)
	}
}
