//go:build !linux

package indexer

import "time"

func threadCPU() (time.Duration, bool) { return 0, false }
