//go:build !linux

package api

import "time"

func threadCPU() (time.Duration, bool) { return 0, false }
