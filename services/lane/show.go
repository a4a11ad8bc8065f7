package lane

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Open is an open batch as `sluice queue` shows it.
type Open struct {
	Lane    string `json:"lane"` // <provider>.<model token>
	ID      string `json:"id"`   // the local id (metadata sluice_batch)
	BatchID string `json:"batch_id,omitempty"`
	State   string `json:"state"`
	Lines   int    `json:"lines"`
	Done    int    `json:"done"` // lines mapped back
	// Reserved is the batch's share of the lane's budget.
	Reserved int64         `json:"reserved"`
	Age      time.Duration `json:"age"`
	// Earliest is the earliest deadline of its jobs (nil: none).
	Earliest *time.Time `json:"earliest,omitempty"`
}

// OpenBatches reads every lane's batch records from the budgets bucket kv.
func OpenBatches(ctx context.Context, kv jetstream.KeyValue, now time.Time) ([]Open, error) {
	lister, err := kv.ListKeysFiltered(ctx, "lane.>")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, err
	}
	var out []Open
	for k := range lister.Keys() {
		lane, _, ok := strings.Cut(strings.TrimPrefix(k, "lane."), ".batch.")
		if !ok {
			continue
		}
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		var r record
		if json.Unmarshal(e.Value(), &r) != nil {
			continue
		}
		o := Open{Lane: lane, ID: r.ID, BatchID: r.BatchID, State: r.State, Lines: len(r.Lines), Reserved: r.Reserved, Age: now.Sub(r.Created), Earliest: r.Earliest}
		for _, l := range r.Lines {
			if l.Done {
				o.Done++
			}
		}
		out = append(out, o)
	}
	return out, nil
}
