package kvindex

import (
	"context"

	"github.com/kvindex/kvindex/blockkeys"
)

// SharedNames is implemented by index backends that other processes write
// to under pod and model names (Redis). A process only interns the names it
// has met, so a reader that never received an event for a model would find
// no ModelID for it and answer as if nobody held anything, while the shared
// index holds the whole fleet. HasModelKey lets the reader ask the shared
// index instead: a model is interned on the read path only when the index
// really holds an entry for it, so client-chosen names cannot grow the
// interner.
type SharedNames interface {
	// HasModelKey reports whether the shared index holds an entry (live or
	// not yet cleaned up) for key under the model called model.
	HasModelKey(ctx context.Context, model string, key blockkeys.Key) (bool, error)
}

// NumModels is how many models have been interned; every ModelID is below
// it (snapshots record the model table by id).
func (in *Interner) NumModels() int {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return len(in.modNames)
}
