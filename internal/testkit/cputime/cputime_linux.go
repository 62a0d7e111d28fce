// Package cputime measures the CPU time of the calling OS thread, for
// benchmarks on shared machines: it leaves out the time the thread waited
// to run, which wall-clock ns/op does not.
package cputime

import (
	"syscall"
	"time"
)

// Thread is the CPU time of the calling OS thread (RUSAGE_THREAD); ok is
// false where it cannot be read.
func Thread() (d time.Duration, ok bool) {
	const rusageThread = 1
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
