//go:build unix

package bench

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system) this process has used: with
// the whole mesh in process, a cost per job that other load on the machine
// disturbs far less than wall-clock throughput.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
