package mesh

import (
	"context"
	"time"
)

// Workers runs functions on goroutines it keeps. A function handed over
// while a worker is idle runs on that worker, on the stack the functions
// before it grew; a new goroutine starts with a small stack and copies it
// at each doubling as a job's handler goes deep (decoders, the JetStream
// client), which cost about 4 % of the process's CPU in `sluice bench
// overhead` with a goroutine per job. A worker waits for more work until
// ctx ends or it has been idle for workerIdle (a burst's peak does not
// keep its goroutines); how many run at once is the callers' bound, as it
// was theirs with a goroutine each. A nil *Workers runs each function on a goroutine
// of its own.
type Workers struct {
	work chan func()
	done <-chan struct{}
}

// NewWorkers returns Workers whose idle workers end when ctx ends.
func NewWorkers(ctx context.Context) *Workers {
	return &Workers{work: make(chan func()), done: ctx.Done()}
}

// Go runs f on an idle worker, or on a new one if none is idle.
func (w *Workers) Go(f func()) {
	if w == nil {
		go f()
		return
	}
	select {
	case w.work <- f:
	default:
		go w.run(f)
	}
}

// workerIdle is how long an idle worker waits for more work.
const workerIdle = 10 * time.Second

func (w *Workers) run(f func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(workerIdle)
		select {
		case f = <-w.work:
		case <-idle.C:
			return
		case <-w.done:
			return
		}
	}
}
