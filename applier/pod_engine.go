package applier

import (
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvindex"
)

// podEngines records, per PodID, the engine whose keys the pod's blocks are
// indexed under: its batches' engine, or EngineSGLangEAGLE for an SGLang
// stream that publishes token pairs (its pages are the pair keys). Pick
// holds a chosen pod's speculative entries under those keys, so that the
// pod's own BlockStored/BlockRemoved (reported through Config.Answered, in
// the same keys) drop them.
//
// The table is copy-on-write: the request path reads it without a lock or
// an allocation; it changes only when a pod first publishes or changes
// engine. It has one byte per PodID, so it is bounded by the interner
// (kvindex.MaxPods entries at most).
type podEngines struct {
	mu  sync.Mutex              // serialises writers
	tab atomic.Pointer[[]uint8] // PodID -> 1 + Engine; 0 = unknown
}

func (t *podEngines) get(id kvindex.PodID) (blockkeys.Engine, bool) {
	p := t.tab.Load()
	if p == nil || int(id) >= len(*p) || (*p)[id] == 0 {
		return 0, false
	}
	return blockkeys.Engine((*p)[id] - 1), true
}

func (t *podEngines) set(id kvindex.PodID, e blockkeys.Engine) {
	if !e.Valid() {
		return
	}
	if got, ok := t.get(id); ok && got == e {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var old []uint8
	if p := t.tab.Load(); p != nil {
		old = *p
	}
	next := make([]uint8, max(len(old), int(id)+1))
	copy(next, old)
	next[id] = uint8(e) + 1
	t.tab.Store(&next)
}

// PodEngine is the engine whose keys the pod's blocks are indexed under,
// false until the pod's first batch was applied here.
func (a *Applier) PodEngine(id kvindex.PodID) (blockkeys.Engine, bool) {
	return a.podEngines.get(id)
}
