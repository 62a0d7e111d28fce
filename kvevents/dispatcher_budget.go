package kvevents

import (
	"sync/atomic"
	"unsafe"

	"github.com/kvindex/kvindex/kvevents/event"
)

// byteBudget is an allowance of bytes shared by all queues.
type byteBudget struct {
	used  atomic.Int64
	limit int64
}

// take reserves n bytes, or reports false without reserving. A batch
// larger than the whole budget is still taken when nothing else is queued,
// so no single batch is refused forever.
func (b *byteBudget) take(n int64) bool {
	for {
		u := b.used.Load()
		if u > 0 && u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *byteBudget) give(n int64) { b.used.Add(-n) }

// batchBytes estimates the memory a decoded batch holds.
func batchBytes(b *event.Batch) int64 {
	n := int64(unsafe.Sizeof(*b)) + int64(len(b.Pod)+len(b.Model))
	for i := range b.Events {
		ev := &b.Events[i]
		n += int64(unsafe.Sizeof(*ev)) + 8*int64(len(ev.BlockHashes)) + 4*int64(len(ev.TokenIDs)) +
			int64(len(ev.LoraName)+len(ev.CacheSalt)) + 32*int64(len(ev.ExtraKeys))
	}
	return n
}
