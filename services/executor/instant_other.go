//go:build !linux

package executor

import "time"

// sleepThread sleeps for d; other systems' timers are not known to be
// coarser than the sleep of a thread.
func sleepThread(d time.Duration) { time.Sleep(d) }
