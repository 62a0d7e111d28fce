//go:build !linux

package mooncake

import "syscall"

const rusageThread = syscall.RUSAGE_SELF
