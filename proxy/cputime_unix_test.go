//go:build unix

package proxy

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user + system) the process has used: the
// benchmarks' measure of work, steadier than wall time on a shared box.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
