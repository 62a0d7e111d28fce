//go:build !linux

package kvindex

// adviseHuge is a no-op where madvise(MADV_HUGEPAGE) does not exist.
func adviseHuge([]uint64) {}
