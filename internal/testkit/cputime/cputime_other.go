//go:build !linux

package cputime

import "time"

// Thread is not available on this platform: ok is false.
func Thread() (d time.Duration, ok bool) { return 0, false }
