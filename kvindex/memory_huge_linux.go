package kvindex

import (
	"syscall"
	"unsafe"
)

// adviseHuge asks the kernel to back a large table or arena with
// transparent huge pages, where THP is in "madvise" mode (the Go runtime
// no longer asks for them itself). At fleet scale the slot tables are
// gigabytes read at random: with 4 KiB pages nearly every scored key also
// misses the TLB, and a page walk (two-dimensional under a hypervisor)
// comes on top of the cache miss; 2 MiB pages keep the whole table within
// TLB reach. Only whole 2 MiB pages inside t are advised; small slices are
// left alone. It must run before t is written, so that first touches
// fault in huge pages. Failure (no THP, old kernel) only costs speed.
func adviseHuge(t []uint64) {
	const huge = 2 << 20
	if len(t)*8 < 4*huge {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t))), len(t)*8)
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	start := int((huge - p%huge) % huge)
	end := start + (len(b)-start)/huge*huge
	_ = syscall.Madvise(b[start:end], syscall.MADV_HUGEPAGE)
}
