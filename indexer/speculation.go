package indexer

import (
	"context"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/indexer/internal/speculation"
	"github.com/kvindex/kvindex/kvevents/event"
)

// Speculation: the pod a Pick chose is assumed to hold the request's blocks
// for a short TTL (PickConfig.SpeculativeTTL), until its own events say so,
// so a burst of identical requests lands on one pod instead of spreading
// before the first one's BlockStored arrives. The entries live in a
// SpeculativeStore: in process (speculation_memory.go), or, with the Redis
// backend, in Redis where every daemon on that index sees them
// (internal/speculation). A batch's events drop the entries they answer
// (dropAnswered). Pick reads them (pick.go) beside the index.

// SpeculativeStore holds speculative entries where several daemons see
// them (one index in Redis, several daemons). Holders are holderIDs, the
// same in every daemon. Every method is safe for concurrent use.
type SpeculativeStore interface {
	// Extend sets ext[i] to how many consecutive blocks from keys[start[i]]
	// are held speculatively by holders[i].
	Extend(ctx context.Context, model string, keys []blockkeys.Key, holders []uint64, start, ext []int32) error
	// Hold records holder for keys for the store's TTL.
	Hold(ctx context.Context, model string, keys []blockkeys.Key, holder uint64) error
	// Drop removes the entries of either holder (a pod named with and
	// without its rank) for keys: its real events for them arrived. keys
	// are as the index holds the pod's blocks (Config.Answered), the keys
	// Hold was given.
	Drop(ctx context.Context, model string, keys []blockkeys.Key, holders [2]uint64) error
}

// sharedSpeculative is the store speculative entries are shared through:
// the Redis index's server, where every daemon on that index sees them;
// nil (in process) for any other backend.
func (ix *Indexer) sharedSpeculative(ttl time.Duration) (SpeculativeStore, error) {
	r := ix.backend.redis
	if r == nil {
		return nil, nil
	}
	return speculation.NewRedis(r.Client(), r.Namespace(), ttl)
}

// dropAnswered drops the speculative entries a batch of the pod answers (the
// applier's Config.Answered): a BlockStored replaces the pod's speculative
// entry with a real one, a BlockRemoved contradicts it. keys are the keys
// the applier indexed those blocks under, the keys Pick holds speculative
// entries under: for a pod whose engine hashes differ from kvindexd's
// (parity mismatch) they are kvindexd's keys, not the engine's hashes in
// the events, which would match no entry and leave it for the full TTL.
func (ix *Indexer) dropAnswered(ctx context.Context, b *event.Batch, keys []blockkeys.Key) {
	p := ix.pick
	if p == nil || p.spec == nil || (p.specMem != nil && p.specMem.len() == 0) {
		return
	}
	// The router may have named the pod with or without its rank. Every
	// event's keys go in one Drop: with the shared store that is one
	// round trip per batch, not one per event and holder.
	holders := [2]uint64{holderID(b.Pod, b.DPRank), holderID(b.Pod, -1)}
	if err := p.spec.Drop(ctx, b.Model, keys, holders); err != nil {
		ix.m.specErrors.Inc() // the entries expire by their TTL anyway
	}
}
