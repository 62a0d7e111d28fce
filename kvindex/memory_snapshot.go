package kvindex

import (
	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// Iteration and restore for snapshots of the in-memory index (package
// snapshot persists them). The index stores each (model, key) as key XOR
// the model's salt, so a block's identity outside the index is that stored
// form, a SlotKey, valid only with the same ModelIDs: a snapshot records
// its model table and SlotKeyOf probes to check that on load.

// SlotKey is a block's key as the memory index stores it.
type SlotKey uint64

// SlotKeyOf is the stored form of (model, key).
func SlotKeyOf(model ModelID, key blockkeys.Key) SlotKey {
	return SlotKey(uint64(key) ^ modelSalt(model))
}

// rangeBuf holds one shard's copy: per block its stored key, its live
// holder count, then the holders, packed.
type rangeBuf struct {
	words   []uint64
	holders []Holder
}

// RangeBlocks calls fn for every stored block with its live holders, shard
// by shard. Each shard is copied under its writer lock (writers of that
// shard wait for the copy, readers never wait) and fn runs after the lock
// is released, so a slow fn does not hold up writers. The holders slice is
// only valid during the call. A non-nil error from fn stops the walk.
//
// The walk is not an atomic picture of the index: a block written during it
// may or may not be seen. Callers that pair it with sequence numbers read
// those first (the content is then at least as new as they say).
func (idx *MemoryIndex) RangeBlocks(fn func(k SlotKey, holders []Holder) error) error {
	var b rangeBuf
	for i := range idx.shards {
		idx.copyShard(&idx.shards[i], &b)
		w := b.words
		for len(w) > 0 {
			sk, n := w[0], int(w[1])
			hs := b.holders[:0]
			for _, x := range w[2 : 2+n] {
				hs = append(hs, Holder{Pod: holderPod(x), Tier: holderTier(x)})
			}
			b.holders = hs
			w = w[2+n:]
			if err := fn(SlotKey(sk), hs); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyShard copies sh's blocks with their live holders into b.words.
func (idx *MemoryIndex) copyShard(sh *shard, b *rangeBuf) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := *sh.tab.Load()
	a := *sh.arena.Load()
	w := b.words[:0]
	for i := 0; i < len(t)/slotWords; i++ {
		v := t[i*slotWords+1]
		var hs []uint64
		switch v & tagMask {
		case tagInline:
			if x := v & holderMask; idx.isLive(x) {
				w = append(w, t[i*slotWords], 1, x)
			}
			continue
		case tagChunk:
			off := int(v & offMask)
			hs = a[off+1 : off+1+valCount(v)]
		default:
			continue
		}
		at := len(w)
		w = append(w, t[i*slotWords], 0)
		for _, x := range hs {
			if idx.isLive(x) {
				w = append(w, x)
			}
		}
		if n := len(w) - at - 2; n > 0 {
			w[at+1] = uint64(n)
		} else {
			w = w[:at]
		}
	}
	b.words = w
}

// RestoreBlock records that holders hold the block stored as k, under each
// pod's current epoch, as Add would. It is for loading a snapshot into an
// index before it serves: the ModelIDs must be the ones k was taken with.
// The capacity bound applies (a smaller index evicts, counted).
func (idx *MemoryIndex) RestoreBlock(k SlotKey, holders []Holder) error {
	sk := uint64(k)
	h := mix64(sk)
	sh := idx.shardOf(h)
	for _, hd := range holders {
		if hd.Tier >= event.NumStoredTiers {
			return errBadTier
		}
		if hd.Pod >= MaxPods {
			return errBadPod
		}
		idx.ensurePod(hd.Pod)
	}
	// One lock for the whole block. commit takes podMu under sh.mu, the
	// order eviction already uses.
	sh.mu.Lock()
	sh.seq.Add(1)
	defer func() {
		sh.seq.Add(1)
		sh.mu.Unlock()
	}()
	for _, hd := range holders {
		epoch := idx.epochOf(hd.Pod)
		newEntry, newBlock, err := sh.add(idx, h, sk, packHolder(hd.Pod, epoch, hd.Tier))
		if err != nil {
			return err
		}
		var dEntries, dBlocks int64
		if newEntry {
			dEntries = 1
		}
		if newBlock {
			dBlocks = 1
		}
		idx.commit(hd.Pod, epoch, dEntries, dBlocks)
	}
	return nil
}

// Reserve sizes the slot tables for about blocks more blocks. Restoring
// blocks in the order RangeBlocks produced them (table order) into tables
// that are still small piles them into long probe runs; tables sized for
// the final count up front take them in order at the cost of one probe
// each.
func (idx *MemoryIndex) Reserve(blocks int64) {
	// 1/8 slack: keys spread over shards by hash, not exactly evenly.
	per := (blocks+int64(len(idx.shards))-1)/int64(len(idx.shards)) + blocks/int64(8*len(idx.shards))
	for i := range idx.shards {
		sh := &idx.shards[i]
		sh.mu.Lock()
		sh.seq.Add(1)
		want := sh.keys.Load() + per
		if n := int64(len(*sh.tab.Load()) / slotWords); want*maxLoadDen > n*maxLoadNum {
			if sh.keys.Load() == 0 {
				for want*maxLoadDen > n*maxLoadNum {
					n *= 2
				}
				t := make([]uint64, n*slotWords)
				adviseHuge(t)
				sh.tab.Store(&t)
				sh.hand = 0
			} else {
				for want*maxLoadDen > int64(len(*sh.tab.Load())/slotWords)*maxLoadNum {
					sh.grow()
				}
			}
		}
		sh.seq.Add(1)
		sh.mu.Unlock()
	}
}
