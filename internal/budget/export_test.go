package budget

import (
	"context"

	"github.com/sluice-dev/sluice/internal/keys"
)

// The backoff's bounds, for the tests in package budget_test.
const (
	ConflictBase     = conflictBase
	ConflictCap      = conflictCap
	ConflictPatience = conflictPatience
)

// Own makes o serve key's schedule as if it had won its election (with
// the elected owner still serving, two owners at once: a handover), and
// reports whether it serves (not before Run runs).
func (o *Owners) Own(key string) bool {
	k, sv := o.keyOf(key)
	if sv == nil {
		var rev uint64
		if e, err := o.kv.Get(context.Background(), keys.ScheduleOwner(key)); err == nil {
			rev = e.Revision() // its renewal takes the record: the other owner learns it a tick later
		}
		o.own(key, k, rev)
	}
	_, sv = o.keyOf(key)
	return sv != nil
}
