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
	var err error
	// Touch the home slots of keys writeAhead ahead (without the lock) so
	// their cache misses overlap instead of stalling one key at a time. The
	// touches are atomic loads, which the compiler never drops; ahead keeps
	// their hashes for when the key's turn comes.
	var ahead [writeAhead]uint64
	for j := 0; j < writeAhead && j < len(keys); j++ {
		ahead[j] = mix64(uint64(keys[j]) ^ salt)
		idx.shardOf(ahead[j]).touch(ahead[j])
	}
	for i, k := range keys {
		if idx.epochOf(pod) != epoch {
			// Cleared while we were adding: what follows belonged to the
			// cleared cache and would be invisible anyway.
			break
		}
		sk := uint64(k) ^ salt
		h := ahead[i%writeAhead]
		if j := i + writeAhead; j < len(keys) {
			hj := mix64(uint64(keys[j]) ^ salt)
			ahead[j%writeAhead] = hj
			idx.shardOf(hj).touch(hj)
		}
		sh := idx.shardOf(h)
		sh.mu.Lock()
		sh.seq.Add(1)
		newEntry, newBlock, e := sh.add(idx, h, sk, hp)
		sh.seq.Add(1)
		sh.mu.Unlock()
		if e != nil {
			err = e
			break
		}
		if newEntry {
			dEntries++
		} else if held != nil {
			held[i] = true
		}
		if newBlock {
			dBlocks++
		}
	}
	idx.commit(pod, epoch, dEntries, dBlocks)
	return err
}

// writeAhead is how many keys ahead Add touches slots.
const writeAhead = 4

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
	var err error
	for _, k := range keys {
		if idx.epochOf(pod) != epoch {
			break
		}
		sk := uint64(k) ^ salt
		h := mix64(sk)
		sh := idx.shardOf(h)
		sh.mu.Lock()
		sh.seq.Add(1)
		removed, lastOfPod, e := sh.remove(idx, h, sk, hp)
		sh.seq.Add(1)
		sh.mu.Unlock()
		if e != nil {
			err = e
			break
		}
		if removed {
			dEntries--
			if lastOfPod {
				dBlocks--
			}
		}
	}
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
