//go:build unix

package sim

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time (user and system, all threads) the process
// has used, for benchmarks to report work per CPU-second, which other
// processes sharing the machine do not inflate as they do wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
