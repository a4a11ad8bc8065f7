package lane

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// lease is one process's hold on a deployment's lane, a record in the
// budgets bucket written by compare-and-set: {holder, until}. A holder
// renews it a third of ttl before it lapses; any process takes a lapsed
// one. The holder acts only while its own view of the lease leaves a
// margin before until, so two processes never act on one lane at once
// (clocks apart by less than the margin).
type lease struct {
	kv     jetstream.KeyValue
	key    string
	holder string
	ttl    time.Duration
	now    func() time.Time
	// until is the lease's end as this process last wrote it (zero: not held).
	until time.Time
}

type leaseRecord struct {
	Holder string    `json:"holder"`
	Until  time.Time `json:"until"`
}

// held renews or takes the lease when it can and reports whether this
// process holds it with a margin.
func (l *lease) held(ctx context.Context) bool {
	now := l.now()
	if !l.until.IsZero() && l.until.Sub(now) > 2*l.ttl/3 {
		return true // renewed recently
	}
	next, _ := json.Marshal(leaseRecord{Holder: l.holder, Until: now.Add(l.ttl)})
	e, err := l.kv.Get(ctx, l.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		_, err = l.kv.Create(ctx, l.key, next)
	case err != nil:
	default:
		var cur leaseRecord
		if json.Unmarshal(e.Value(), &cur) == nil && cur.Holder != l.holder && now.Before(cur.Until) {
			l.until = time.Time{}
			return false // another's, live
		}
		_, err = l.kv.Update(ctx, l.key, next, e.Revision())
	}
	if err != nil {
		// Not written: held only while the last write lasts.
		return !l.until.IsZero() && l.until.Sub(now) > l.ttl/3
	}
	l.until = now.Add(l.ttl)
	return true
}
