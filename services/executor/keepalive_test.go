package executor

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// working counts the in-progress notices a message gets.
type working struct {
	jetstream.Msg
	n atomic.Int32
}

func (m *working) InProgress() error { m.n.Add(1); return nil }

// keepAlive tells JetStream every keepAliveEvery while the call runs, and
// never after it is stopped or its context ends.
func TestKeepAlive(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		stopped, ended := &working{}, &working{}
		stop := keepAlive(ctx, stopped)
		endCtx, end := context.WithCancel(ctx)
		stopEnded := keepAlive(endCtx, ended)
		defer stopEnded()

		time.Sleep(keepAliveEvery / 2) // synctest's virtual time: the period is the logic
		synctest.Wait()
		if n := stopped.n.Load(); n != 0 {
			t.Fatalf("got %d notices before the first period, want 0", n)
		}
		time.Sleep(2*keepAliveEvery + keepAliveEvery/4) // synctest's virtual time, as above
		synctest.Wait()
		if n := stopped.n.Load(); n != 2 {
			t.Fatalf("got %d notices in 2.25 periods, want 2", n)
		}
		stop()
		end()
		before := ended.n.Load()
		time.Sleep(3 * keepAliveEvery) // synctest's virtual time, as above
		synctest.Wait()
		if n := stopped.n.Load(); n != 2 {
			t.Errorf("got %d notices after stop, want none more than 2", n)
		}
		if n := ended.n.Load(); n != before {
			t.Errorf("got %d notices after the context ended, want %d", n, before)
		}
	})
}
