package executor

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// epochCache owns this process's view of each model's last limit cut,
// and with it whether a paced call was planned before that cut (drained).
type epochCache struct {
	*env
	learn *adapt.Store
	// warming holds, per learn key, whether its last cut is being read
	// ahead of a paced call (warmEpoch).
	warming sync.Map
	epochMu sync.Mutex
	epochs  map[string]epochView // learn key -> last cut, as last read
}

// epochRefresh is how stale this process's view of a model's last cut may
// be when it decides whether to drain a call.
const epochRefresh = 100 * time.Millisecond

type epochView struct {
	epoch int64 // unix ms of the last cut
	read  time.Time
}

// drained reports whether the model's limits were cut after j was planned
// (plus the time admission takes to see a cut): such a call was paced at a
// rate the provider refused, and sending it would likely draw another 429.
func (s *epochCache) drained(ctx context.Context, j *task.Task) bool {
	key := adapt.Key(j.Provider, job.ModelToken(j.Model))
	s.epochMu.Lock()
	v := s.epochs[key]
	s.epochMu.Unlock()
	if now := s.now(); now.Sub(v.read) >= epochRefresh {
		var err error
		if v, err = s.readEpoch(ctx, key, now); err != nil {
			return false
		}
	}
	return v.epoch > 0 && j.Reservation.ReservedAt.UnixMilli() < v.epoch+adapt.AdmissionRefresh.Milliseconds()
}

// readEpoch reads the model's last cut (learn key) at now and keeps it.
func (s *epochCache) readEpoch(ctx context.Context, key string, now time.Time) (epochView, error) {
	st, _, err := s.learn.Get(ctx, key)
	if err != nil {
		return epochView{}, err
	}
	v := epochView{epoch: st.Epoch, read: now}
	s.epochMu.Lock()
	s.epochs[key] = v
	s.epochMu.Unlock()
	return v, nil
}

// warmEpoch reads the model's last cut now, in the background, when the
// view drained consults before the call would be stale by its instant:
// the read is then done while the call crosses to its executor, not on
// its transit (which the lead of every paced call is learned from). One
// read per model at a time; drained still reads itself a view it finds
// stale. The read is counted among the service's calls (start, done).
func (s *epochCache) warmEpoch(ctx context.Context, j *task.Task, start func() bool, done func()) {
	key := adapt.Key(j.Provider, job.ModelToken(j.Model))
	s.epochMu.Lock()
	v := s.epochs[key]
	s.epochMu.Unlock()
	if j.Reservation.SendAt.Sub(v.read) < epochRefresh {
		return
	}
	busy, _ := s.warming.LoadOrStore(key, new(atomic.Bool))
	if !busy.(*atomic.Bool).CompareAndSwap(false, true) {
		return
	}
	if !start() {
		busy.(*atomic.Bool).Store(false)
		return
	}
	go func() {
		defer done()
		defer busy.(*atomic.Bool).Store(false)
		_, _ = s.readEpoch(ctx, key, s.now())
	}()
}
