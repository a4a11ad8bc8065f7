package executor

import (
	"syscall"
	"time"
)

// sleepThread puts the calling thread to sleep for d (or less, when a
// signal interrupts it), off the runtime's timers.
func sleepThread(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	_ = syscall.Nanosleep(&ts, nil)
}
