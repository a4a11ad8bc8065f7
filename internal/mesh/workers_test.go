package mesh

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"testing/synctest"
	"time"
)

// goroutineID is the running goroutine's number, from its stack's header
// ("goroutine 7 [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	return string(id)
}

// A function handed to Workers while a worker is idle runs on that
// worker; idle workers end with their context (synctest.Test fails on a
// goroutine left blocked).
func TestWorkersReuseAnIdleWorker(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		w := NewWorkers(ctx)
		ids := make(chan string, 1)
		w.Go(func() { ids <- goroutineID() })
		first := <-ids
		synctest.Wait() // the worker waits for more
		w.Go(func() { ids <- goroutineID() })
		if second := <-ids; second != first {
			t.Errorf("second function ran on goroutine %s, want the idle worker %s", second, first)
		}
		// A worker busy when work comes leaves it to a new one.
		release := make(chan struct{})
		w.Go(func() { ids <- goroutineID(); <-release })
		busy := <-ids
		synctest.Wait()
		w.Go(func() { ids <- goroutineID() })
		third := <-ids
		if third == first {
			t.Errorf("third function ran on the busy worker %s", first)
		}
		close(release)
		// Workers idle for workerIdle end: the next function starts a
		// new one.
		synctest.Wait()
		time.Sleep(workerIdle + time.Second) // synctest's virtual time: the idle period is the logic
		synctest.Wait()
		w.Go(func() { ids <- goroutineID() })
		if fourth := <-ids; fourth == first || fourth == busy || fourth == third {
			t.Errorf("after %v idle, a function ran on an old worker (%s; old: %s, %s, %s); want a new one", workerIdle, fourth, first, busy, third)
		}
		cancel()
	})
}

// A nil *Workers runs each function on a goroutine of its own.
func TestNilWorkers(t *testing.T) {
	t.Parallel()
	var w *Workers
	done := make(chan struct{})
	w.Go(func() { close(done) })
	<-done
}
