package budget

import (
	"context"
	"errors"
	"time"
)

// OpKind is what an Op does to a schedule.
type OpKind string

// The writes of a schedule: a placement (TakeAt), give-backs (ReturnAll,
// lapsed or not; ReturnRewindAll) and settlements (SettleAll).
const (
	OpTake   OpKind = "take"
	OpReturn OpKind = "return"
	OpLapsed OpKind = "lapsed"
	OpRewind OpKind = "rewind"
	OpSettle OpKind = "settle"
)

// Op is one write of a key's window, as a value: applied by this process
// (applyAll) or sent to the schedule's owner (owner.go), which applies
// many in one compare-and-set.
type Op struct {
	Kind OpKind `json:"k"`
	// Take (and Lim for Rewind: the pace rewound at).
	Lim       Limits        `json:"lim,omitzero"`
	Costs     []Cost        `json:"costs,omitempty"`
	NotBefore []time.Time   `json:"nb,omitempty"`
	Lead      time.Duration `json:"lead,omitempty"` // the asker's: placements start this far from now
	Returns   []Return      `json:"ret,omitempty"`
	Settles   []Settlement  `json:"set,omitempty"`
	// Grant is a take's result.
	Grant Grant `json:"-"`
}

// gives reports whether o only gives room back: lost, it errs towards
// the limits; applied twice, it would not (owner.go).
func (o *Op) gives() bool { return o.Kind == OpReturn || o.Kind == OpLapsed || o.Kind == OpRewind }

// apply applies o to w (pruned at now, in slice cur) and reports whether
// w changed; a take's grant goes to o.Grant.
func (s *Store) apply(o *Op, w *Window, cur int64, now time.Time) bool {
	switch o.Kind {
	case OpTake:
		if s.p.paced() {
			o.Grant = s.place(w, o.Lim, o.Costs, o.NotBefore, now, o.Lead)
		} else {
			o.Grant = s.plan(w, o.Lim, o.Costs, cur)
		}
		o.Grant.Planned = now
		return o.Grant.N > 0
	case OpReturn, OpLapsed:
		return s.returnAll(w, cur, o.Returns, o.Kind == OpLapsed)
	case OpRewind:
		return s.rewindAll(w, cur, o.Returns, o.Lim)
	case OpSettle:
		return s.settleAll(w, cur, o.Settles)
	}
	return false
}

// write applies o to key's window: through the schedule's owner when
// there is one (owner.go), else here.
func (s *Store) write(ctx context.Context, key string, o *Op) error {
	if s.p.paced() {
		if done, err := s.routed(ctx, key, o); done {
			return err
		}
	}
	if o.Kind == OpTake {
		return s.applyAll(ctx, key, []*Op{o})
	}
	return s.modify(ctx, key, string(o.Kind), func(w *Window, cur int64) bool {
		return s.apply(o, w, cur, s.now())
	})
}

// routed sends o to key's owner when s has Owners; done reports whether
// it was dealt with (else the caller applies it here).
func (s *Store) routed(ctx context.Context, key string, o *Op) (done bool, err error) {
	if s.Owners == nil {
		return false, nil
	}
	return s.Owners.ask(ctx, key, o)
}

// applyAll applies ops in order to key's window with one compare-and-set,
// retried (all of them, from a fresh read) when it is lost, after a
// backoff (backoff.go). It starts from the copy this process wrote last
// when copies have mostly been current (known.go). A take refused on such
// a copy is tried again on a fresh read: the copy may be stale with less
// room than the window has.
func (s *Store) applyAll(ctx context.Context, key string, ops []*Op) error {
	b := s.backoff()
	for {
		w, rev, known := s.known.take(key)
		if !known {
			wrote := rev
			var err error
			if w, rev, err = s.load(ctx, key); err != nil {
				return err
			}
			if wrote != 0 {
				s.known.count(key, rev == wrote)
			}
		}
		now := s.now()
		cur := s.sliceOf(now)
		w.prune(cur - s.p.Span() + 1)
		if s.p.paced() {
			s.prunePlanned(&w, now)
		}
		changed, refused := false, false
		for _, o := range ops {
			if s.apply(o, &w, cur, now) {
				changed = true
			} else if o.Kind == OpTake {
				refused = true
			}
		}
		if refused && known {
			continue
		}
		if !changed {
			return nil
		}
		rev, err := s.store(ctx, key, w, rev)
		if err != nil {
			if !errors.Is(err, errConflict) {
				return err
			}
			if known {
				// The copy was stale (known.go): read the window, as
				// without one; no contention to report.
				s.known.count(key, false)
				continue
			}
			if s.Conflicts != nil {
				s.Conflicts()
			}
			if err := b.wait(ctx, string(ops[0].Kind), key); err != nil {
				return err
			}
			continue
		}
		if known {
			s.known.count(key, true)
		}
		s.known.keep(key, w, rev)
		return nil
	}
}
