package indexer

import (
	"context"
	"sync"
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
	// without its rank) for the blocks whose engine hashes are given: its
	// real events for them arrived.
	Drop(ctx context.Context, model string, hashes []uint64, holders [2]uint64) error
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

// dropAnswered drops the speculative entries the events of b answer: a
// BlockStored replaces the pod's speculative entry with a real one, a
// BlockRemoved contradicts it.
func (ix *Indexer) dropAnswered(ctx context.Context, b *event.Batch) {
	p := ix.pick
	if p.spec == nil || (p.specMem != nil && p.specMem.len() == 0) {
		return
	}
	// The router may have named the pod with or without its rank. Every
	// event's hashes go in one Drop: with the shared store that is one
	// round trip per batch, not one per event and holder.
	holders := [2]uint64{holderID(b.Pod, b.DPRank), holderID(b.Pod, -1)}
	var hashes []uint64
	var buf *[]uint64
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Kind != event.BlockStored && ev.Kind != event.BlockRemoved || len(ev.BlockHashes) == 0 {
			continue
		}
		switch {
		case hashes == nil:
			hashes = ev.BlockHashes // the common batch: one event, no copy
		case buf == nil:
			buf = dropBufs.Get().(*[]uint64)
			*buf = append(append((*buf)[:0], hashes...), ev.BlockHashes...)
			hashes = *buf
		default:
			*buf = append(*buf, ev.BlockHashes...)
			hashes = *buf
		}
	}
	if err := p.spec.Drop(ctx, b.Model, hashes, holders); err != nil {
		ix.m.specErrors.Inc() // the entries expire by their TTL anyway
	}
	if buf != nil && cap(*buf) <= maxDropBuf {
		dropBufs.Put(buf)
	}
}

// dropBufs gathers the hashes of a batch's events for one Drop; a buffer
// grown past maxDropBuf (a batch of unusual size) is left to the GC.
var dropBufs = sync.Pool{New: func() any { return new([]uint64) }}

const maxDropBuf = 1 << 16
