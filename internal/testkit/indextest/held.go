package indextest

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/kvindex/kvindex/kvindex"
)

// HeldIndex is an in-memory index whose writes (Add) wait once Hold is
// called, until Release or the write's context ends: an index backend that
// stopped answering. Reads never wait.
type HeldIndex struct {
	*kvindex.MemoryIndex
	held        atomic.Bool
	entered     chan struct{}
	enterOnce   sync.Once
	release     chan struct{}
	releaseOnce sync.Once
}

// NewHeldIndex returns an empty HeldIndex that does not hold yet.
func NewHeldIndex() *HeldIndex {
	return &HeldIndex{MemoryIndex: kvindex.NewMemoryIndex(kvindex.MemoryConfig{}),
		entered: make(chan struct{}), release: make(chan struct{})}
}

// Hold makes every later write wait for Release.
func (h *HeldIndex) Hold() { h.held.Store(true) }

// Entered is closed once a write waits.
func (h *HeldIndex) Entered() <-chan struct{} { return h.entered }

// Release lets every waiting and later write through; it may be called
// more than once.
func (h *HeldIndex) Release() { h.releaseOnce.Do(func() { close(h.release) }) }

// Add waits while the index is held, then adds.
func (h *HeldIndex) Add(ctx context.Context, m kvindex.ModelID, p kvindex.PodID, t event.Tier, keys []blockkeys.Key) error {
	h.wait(ctx)
	return h.MemoryIndex.Add(ctx, m, p, t, keys)
}

// AddHeld waits too, so the index holds its writes also when it is given
// as a backend's Held (the applier then writes stored blocks through it).
func (h *HeldIndex) AddHeld(ctx context.Context, m kvindex.ModelID, p kvindex.PodID, t event.Tier, keys []blockkeys.Key, held []bool) error {
	h.wait(ctx)
	return h.MemoryIndex.AddHeld(ctx, m, p, t, keys, held)
}

// wait blocks while the index is held.
func (h *HeldIndex) wait(ctx context.Context) {
	if h.held.Load() {
		h.enterOnce.Do(func() { close(h.entered) })
		select { // released, or Apply's context ends (shutdown)
		case <-h.release:
		case <-ctx.Done():
		}
	}
}
