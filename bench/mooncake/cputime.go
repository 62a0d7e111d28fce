package mooncake

import (
	"syscall"
	"time"
)

// cpuTime is the process's user + system CPU time.
type cpuTime struct{ t, sys time.Duration }

func (c *cpuTime) read() {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.t, c.sys = time.Duration(ru.Utime.Nano()+ru.Stime.Nano()), time.Duration(ru.Stime.Nano())
	}
}

func (c cpuTime) sub(o cpuTime) time.Duration { return c.t - o.t }
