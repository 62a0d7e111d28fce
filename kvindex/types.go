// Package kvindex is the block index: the Index contract (which pods hold
// which block keys, on which tier), the interner that turns pod and model
// names into small integers, the in-memory backend (memory_*.go) and the
// scorer that turns an index lookup into each pod's longest cached prefix.
// The Redis backend is its subpackage redisindex.
//
// It knows nothing of ZeroMQ, gRPC or HTTP, nor of engine events: block keys
// come from package blockkeys, batches are applied by package applier, and
// package indexer wires them together on one interner. It does not own a
// pod's trust: the applier reports what a batch did to the index
// (event.ApplyOutcome) and kvevents, which records it, says whether the pod
// may be served.
package kvindex

import (
	"context"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// PodID is an interned (pod name, data-parallel rank) pair. Two DP ranks of one
// pod are separate engines with separate caches, so they are separate PodIDs.
type PodID uint32

// ModelID is an interned model name.
type ModelID uint32

// Holder is one pod holding one block: which pod (with its DP rank, through
// PodID) and on which tier. KV-cache groups (hybrid models) are not part of
// it: the applier indexes a block once every full-attention group holds it
// (package applier, holding.go), so the index sees one group.
type Holder struct {
	Pod  PodID
	Tier event.Tier
}

// Visitor receives the holders of each looked-up key in order. holders is only
// valid during the call. Returning false stops the lookup. Visitor is an
// interface (not a func) so the scorer can pass a pointer without allocating.
type Visitor interface {
	Visit(i int, key blockkeys.Key, holders []Holder) bool
}

// IndexStats are the counters an index exposes for metrics.
type IndexStats struct {
	Entries   int64 // (block, holder) entries currently held
	Keys      int64 // distinct (model, key) entries
	Evictions int64 // entries dropped because the capacity bound was reached
	Expired   int64 // entries dropped by a TTL (Redis safety net)
}

// Index maps (model, block key) to the pods holding that block. Every method is
// safe for concurrent use.
type Index interface {
	// Add records that pod holds keys on tier.
	Add(ctx context.Context, model ModelID, pod PodID, tier event.Tier, keys []blockkeys.Key) error
	// Remove forgets that pod holds keys on tier. Unknown keys are ignored.
	Remove(ctx context.Context, model ModelID, pod PodID, tier event.Tier, keys []blockkeys.Key) error
	// ClearPod forgets everything pod holds, in O(1) (epochs), not a scan.
	ClearPod(ctx context.Context, pod PodID) error
	// Lookup calls v.Visit for keys[0], keys[1], ... in order with each key's
	// live holders, stopping when Visit returns false or a key has no holder.
	Lookup(ctx context.Context, model ModelID, keys []blockkeys.Key, v Visitor) error
	// PodBlocks is how many blocks pod currently holds (all tiers).
	PodBlocks(ctx context.Context, pod PodID) (int64, error)
	// Stats returns the index counters.
	Stats() IndexStats
}

// HeldAdder is implemented by index backends that can tell, while adding,
// which keys the pod already held on the tier: the in-memory index reads
// each key's holders to add to them anyway, so the answer is free there,
// where Redis would need a read per key (it does not implement it).
// The applier uses it to count a vLLM pod's extra copies of a block
// (applier/tables.go) only for blocks stored again, instead of a count per
// block: a table lookup, a memory miss at scale, per stored and removed
// block less.
//
// AddHeld is Add that also sets held[i] to whether pod held keys[i] on tier
// before the call (a duplicate within keys is held the second time). It
// needs len(held) >= len(keys); keys it did not get to (an error, or the pod
// cleared meanwhile) are reported not held. An index that wraps another and
// intercepts Add must intercept AddHeld too, or not offer it: the applier
// writes stored blocks through AddHeld when the index has it.
type HeldAdder interface {
	AddHeld(ctx context.Context, model ModelID, pod PodID, tier event.Tier, keys []blockkeys.Key, held []bool) error
}

// PodBlocksBatcher is implemented by index backends that can answer
// PodBlocks for many pods at once much cheaper than one call per pod (Redis:
// one round trip instead of one per pod). Pod listings use it when the index
// has it and fall back to PodBlocks otherwise. PodBlocksBatch sets out[i] to
// what PodBlocks(pods[i]) would return; callers pass len(out) == len(pods).
// On error the contents of out are unspecified.
type PodBlocksBatcher interface {
	PodBlocksBatch(ctx context.Context, pods []PodID, out []int64) error
}

// HealthChecker is implemented by index backends that can be unavailable
// (Redis). The daemon reports not-ready while Healthy returns an error.
type HealthChecker interface {
	Healthy(ctx context.Context) error
}
