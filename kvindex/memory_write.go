package kvindex

import (
	"context"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// The write path: Add and Remove walk their keys, taking each key's shard
// lock for one change; the table work itself lives in memory_shard.go.

// Add records that pod holds keys on tier. Adding a held (key, pod, tier)
// again changes nothing but its recency.
func (idx *MemoryIndex) Add(ctx context.Context, model ModelID, pod PodID, tier event.Tier, keys []blockkeys.Key) error {
	return idx.AddHeld(ctx, model, pod, tier, keys, nil)
}

var _ HeldAdder = (*MemoryIndex)(nil)

// AddHeld is Add that reports in held which keys pod already held on tier
// (HeldAdder); held may be nil when no report is wanted.
func (idx *MemoryIndex) AddHeld(ctx context.Context, model ModelID, pod PodID, tier event.Tier, keys []blockkeys.Key, held []bool) error {
	if held != nil {
		if len(held) < len(keys) {
			return errShortHeld
		}
		clear(held[:len(keys)])
	}
	if tier >= event.NumStoredTiers {
		return errBadTier
	}
	if pod >= MaxPods {
		return errBadPod
	}
	if len(keys) == 0 {
		return nil
	}
	idx.ensurePod(pod)
	epoch := idx.epochOf(pod)
	hp := packHolder(pod, epoch, tier)
	salt := modelSalt(model)
	var dEntries, dBlocks int64
	err := idx.eachLocked(pod, epoch, keys, salt, func(i int, sh *shard, h, sk uint64) error {
		newEntry, newBlock, err := sh.add(idx, h, sk, hp)
		if err != nil {
			return err
		}
		if newEntry {
			dEntries++
		} else if held != nil {
			held[i] = true
		}
		if newBlock {
			dBlocks++
		}
		return nil
	})
	idx.commit(pod, epoch, dEntries, dBlocks)
	return err
}

// writeGroup is how many keys Add and Remove touch (touchGroup) before
// changing them one at a time under their shards' locks.
const writeGroup = 16

// eachLocked runs change on each of keys (i its index in keys, h its hash,
// sk the salted key) under its shard's lock with the shard's sequence odd,
// touching each group of writeGroup keys first (touchGroup). It stops at the
// first error, or without one once pod's epoch is no longer epoch: cleared
// meanwhile, what follows belonged to the cleared cache and would be
// invisible anyway.
func (idx *MemoryIndex) eachLocked(pod PodID, epoch uint32, keys []blockkeys.Key, salt uint64, change func(i int, sh *shard, h, sk uint64) error) error {
	var group [writeGroup]uint64
	for g := 0; g < len(keys); g += writeGroup {
		ks := keys[g:min(g+writeGroup, len(keys))]
		hs := group[:len(ks)]
		idx.touchGroup(ks, salt, hs)
		for j, k := range ks {
			if idx.epochOf(pod) != epoch {
				return nil
			}
			sh := idx.shardOf(hs[j])
			sh.mu.Lock()
			sh.seq.Add(1)
			err := change(g+j, sh, hs[j], uint64(k)^salt)
			sh.seq.Add(1)
			sh.mu.Unlock()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// touchGroup hashes keys (salted) into hs and loads the home slot of each,
// then, for a slot pointing at a chunk, the chunk's first word: the misses
// of a group overlap instead of stalling one key at a time. It must run
// before the group's first lock: an x86 locked instruction waits for every
// earlier load, so a touch issued between two keys' locks would stall the
// second lock for its whole miss, and the misses would stay serial. The
// loads are atomic (their values are unused, and the compiler keeps them)
// and take no lock: a table or arena replaced meanwhile only makes a touch
// useless, never wrong.
func (idx *MemoryIndex) touchGroup(keys []blockkeys.Key, salt uint64, hs []uint64) {
	for j, k := range keys {
		h := mix64(uint64(k) ^ salt)
		hs[j] = h
		idx.shardOf(h).touch(h)
	}
	for _, h := range hs {
		idx.shardOf(h).touchChunk(h)
	}
}

// Remove forgets that pod holds keys on tier. Unknown keys are ignored.
func (idx *MemoryIndex) Remove(ctx context.Context, model ModelID, pod PodID, tier event.Tier, keys []blockkeys.Key) error {
	if tier >= event.NumStoredTiers {
		return errBadTier
	}
	if pod >= MaxPods {
		return errBadPod
	}
	if len(keys) == 0 || idx.epochs[pod>>podPageBits].Load() == nil {
		return nil
	}
	epoch := idx.epochOf(pod)
	hp := packHolder(pod, epoch, tier)
	salt := modelSalt(model)
	var dEntries, dBlocks int64
	err := idx.eachLocked(pod, epoch, keys, salt, func(_ int, sh *shard, h, sk uint64) error {
		removed, lastOfPod, err := sh.remove(idx, h, sk, hp)
		if removed {
			dEntries--
			if lastOfPod {
				dBlocks--
			}
		}
		return err
	})
	idx.commit(pod, epoch, dEntries, dBlocks)
	return err
}

// commit applies a call's counter deltas unless the pod was cleared since the
// call read its epoch: then every holder it touched is stale and the clear
// already reset the counters.
func (idx *MemoryIndex) commit(pod PodID, epoch uint32, dEntries, dBlocks int64) {
	if dEntries == 0 && dBlocks == 0 {
		return
	}
	idx.podMu.Lock()
	if idx.epochOf(pod) == epoch {
		c := idx.count(pod)
		c.entries += dEntries
		c.blocks += dBlocks
		idx.live.Add(dEntries)
	}
	idx.podMu.Unlock()
}
