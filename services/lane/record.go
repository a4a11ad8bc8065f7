package lane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// record is a batch as the budgets bucket keeps it (key
// lane.batch.<provider>.<model>.<id>). It is written before the batch is
// submitted and deleted once every line is done, so whoever owns the lane
// next knows every job that is, or may be, in a batch.
type record struct {
	ID string `json:"id"` // local id, also the provider batch's metadata key
	// State: submitting (written, no call made), calling (the create call
	// made, its outcome not known), running (the
	// provider's id known), ended (its results are being mapped back).
	State   string `json:"state"`
	BatchID string `json:"batch_id,omitempty"`
	Created time.Time
	// Earliest is the earliest deadline of its jobs (nil: none has one).
	Earliest *time.Time `json:"earliest,omitempty"`
	// Reserved is what the batch holds of the lane's budget.
	Reserved int64            `json:"reserved"`
	Lines    map[string]*line `json:"lines"` // by custom id
}

// line is one job of a batch.
type line struct {
	Tenant string `json:"tenant"`
	Job    string `json:"job"`
	Op     string `json:"op"`     // the operation record's key
	Seq    uint64 `json:"seq"`    // its LANE message's stream sequence
	Tokens int64  `json:"tokens"` // its prompt estimate
	// Res is what the line's end was decided to be before it was acted on
	// (result, sync, failed), and Done that it was acted on and its LANE
	// message acknowledged.
	Res  string `json:"res,omitempty"`
	Done bool   `json:"done,omitempty"`
}

const (
	stateSubmitting = "submitting"
	stateCalling    = "calling" // the create call is (or was) under way
	stateRunning    = "running"
	stateEnded      = "ended"
)

// open is a record and its revision in the bucket.
type open struct {
	rec *record
	rev uint64
	// results, once the batch ended: by custom id.
	results  map[string]resultOf
	lastPoll time.Time
	// cancelled: this process asked the provider to cancel it (rescue).
	cancelled bool
}

// records owns the lane's batch records in the budgets bucket and the
// open batches this process knows of: read when it takes the lane,
// written before a batch is submitted and deleted once every line is
// done.
type records struct {
	*env
	budget  *laneBudget
	batches map[string]*open // by local id
}

// put writes o's record by compare-and-set (create when rev is 0).
func (c *records) put(ctx context.Context, o *open) error {
	data, err := json.Marshal(o.rec)
	if err != nil {
		return err
	}
	var rev uint64
	if o.rev == 0 {
		rev, err = c.kv.Create(ctx, c.keyBase+"batch."+o.rec.ID, data)
	} else {
		rev, err = c.kv.Update(ctx, c.keyBase+"batch."+o.rec.ID, data, o.rev)
	}
	if err != nil {
		return fmt.Errorf("lane batch record %s: %w", o.rec.ID, err)
	}
	o.rev = rev
	return nil
}

// drop deletes o's record.
func (c *records) drop(ctx context.Context, o *open) error {
	err := c.kv.Delete(ctx, c.keyBase+"batch."+o.rec.ID, jetstream.LastRevision(o.rev))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	delete(c.batches, o.rec.ID)
	return nil
}

// load reads every batch record of the lane.
func (c *records) load(ctx context.Context) error {
	lister, err := c.kv.ListKeysFiltered(ctx, c.keyBase+"batch.>")
	if err != nil {
		return err
	}
	var names []string
	for k := range lister.Keys() {
		names = append(names, k)
	}
	for _, k := range names {
		e, err := c.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		} else if err != nil {
			return err
		}
		var r record
		if err := json.Unmarshal(e.Value(), &r); err != nil || r.ID == "" {
			c.log.Error("lane: unreadable batch record left alone", "key", k)
			continue
		}
		c.batches[r.ID] = &open{rec: &r, rev: e.Revision()}
	}
	// A reservation whose batch has no record (its holder lost between
	// the two writes) holds nothing.
	return c.budget.updateBudget(ctx, func(b *budget) bool {
		stale := false
		for id := range b.Held {
			if _, ok := c.batches[id]; !ok {
				delete(b.Held, id)
				stale = true
			}
		}
		return stale
	})
}

// budget is the lane's share of the provider's batch limit (OpenAI's
// enqueued tokens, Anthropic's queued requests): a record of the amounts
// each open batch holds, so reserving and releasing are idempotent (a
// batch's entry is added or removed, never counted twice).
type budget struct {
	Held map[string]int64 `json:"held"` // batch id -> amount
}

func (b budget) total() int64 {
	var n int64
	for _, v := range b.Held {
		n += v
	}
	return n
}

// laneBudget owns the lane's budget record: what each open batch holds of
// the provider's batch limit, reserved before a batch is submitted and
// released once it has ended or never ran.
type laneBudget struct {
	*env
}

// reserve adds id's amount when it fits under limit (0: none) and
// reports whether it did; an id already held counts as reserved.
func (c *laneBudget) reserve(ctx context.Context, id string, amount, limit int64) (bool, error) {
	ok := false
	err := c.updateBudget(ctx, func(b *budget) bool {
		if _, held := b.Held[id]; held {
			ok = true
			return false
		}
		if limit > 0 && b.total()+amount > limit {
			return false
		}
		b.Held[id], ok = amount, true
		return true
	})
	return ok, err
}

// release removes id's amount.
func (c *laneBudget) release(ctx context.Context, id string) error {
	return c.updateBudget(ctx, func(b *budget) bool {
		if _, held := b.Held[id]; !held {
			return false
		}
		delete(b.Held, id)
		return true
	})
}

// room is what the budget has left under limit (limit 0: unbounded).
func (c *laneBudget) room(ctx context.Context, limit int64) (int64, error) {
	if limit <= 0 {
		return 1 << 62, nil
	}
	var left int64
	err := c.updateBudget(ctx, func(b *budget) bool { left = limit - b.total(); return false })
	return left, err
}

func (c *laneBudget) updateBudget(ctx context.Context, fn func(*budget) bool) error {
	key := c.keyBase + "budget"
	for range 50 {
		var b budget
		var rev uint64
		e, err := c.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return err
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &b); err != nil {
				return fmt.Errorf("lane budget %s: %w", key, err)
			}
		}
		if b.Held == nil {
			b.Held = map[string]int64{}
		}
		if !fn(&b) {
			c.ms.LaneEnqueued.WithLabelValues(c.provider, c.model, c.unit, "used").Set(float64(b.total()))
			return nil
		}
		data, _ := json.Marshal(b)
		if rev == 0 {
			_, err = c.kv.Create(ctx, key, data)
		} else {
			_, err = c.kv.Update(ctx, key, data, rev)
		}
		if err == nil {
			c.ms.LaneEnqueued.WithLabelValues(c.provider, c.model, c.unit, "used").Set(float64(b.total()))
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSeq(err) {
			return err
		}
	}
	return fmt.Errorf("lane budget %s: too many conflicts", key)
}

func isWrongSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}
