package kvindex

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// shard is one slice of the index: an open-addressing table of slots, the
// arena holding the chunks its slots point to, the seqlock that lets readers
// copy both without a lock, and the CLOCK hand that evicts when the shard is
// at its share of the capacity. Readers use only the atomic fields (see
// memory_read.go); everything else belongs to the writer holding mu.
type shard struct {
	// read by lock-free readers
	seq   atomic.Uint64            // odd while a writer is changing the shard
	tab   atomic.Pointer[[]uint64] // slotWords words per slot
	arena atomic.Pointer[[]uint64] // holder chunks; len == cap
	keys  atomic.Int64             // occupied slots (for Stats)

	// writer-only state, guarded by mu
	mu       sync.Mutex
	arenaLen int
	used     int64 // physical holder words in use, stale included
	cap      int64
	hand     int
	scratch  []uint64
	free     *[maxClass + 1][]uint32

	_ [24]byte // keep neighbouring shards' hot words off one cache line
}

// The writer side. Everything below runs under sh.mu with sh.seq odd. Plain
// reads are safe there (no one else writes); writes to published tables and
// arenas are atomic because readers load them concurrently.

// find returns the slot of sk, or the empty slot where it would go.
func (sh *shard) find(t []uint64, h, sk uint64) (int, bool) {
	mask := len(t)/slotWords - 1
	i := int(h) & mask
	for {
		if t[i*slotWords+1] == 0 {
			return i, false
		}
		if t[i*slotWords] == sk {
			return i, true
		}
		i = (i + 1) & mask
	}
}

// load copies slot i's holders into the shard's scratch buffer.
func (sh *shard) load(t []uint64, i int) []uint64 {
	v := t[i*slotWords+1]
	hs := sh.scratch[:0]
	switch v & tagMask {
	case tagInline:
		hs = append(hs, v&holderMask)
	case tagChunk:
		off := int(v & offMask)
		a := *sh.arena.Load()
		hs = append(hs, a[off+1:off+1+valCount(v)]...)
	}
	sh.scratch = hs
	return hs
}

// dropStale removes holders of cleared pods from hs in place.
func (sh *shard) dropStale(idx *MemoryIndex, hs []uint64) []uint64 {
	w := 0
	for _, x := range hs {
		if idx.isLive(x) {
			hs[w] = x
			w++
		}
	}
	sh.used -= int64(len(hs) - w)
	return hs[:w]
}

// store writes hs as slot i's holder set, choosing inline or a chunk of a
// fitting class, and deletes the slot when hs is empty.
func (sh *shard) store(t []uint64, i int, hs []uint64, ref bool) error {
	v := t[i*slotWords+1]
	oldClass, oldOff := -1, 0
	if v&tagMask == tagChunk {
		oldClass, oldOff = valClass(v), int(v&offMask)
	}
	r := v & refBit
	if ref {
		r = refBit
	}
	var nv uint64
	switch {
	case len(hs) == 0:
		sh.freeChunk(oldClass, oldOff)
		sh.deleteSlot(t, i)
		return nil
	case len(hs) == 1:
		nv = tagInline | r | hs[0]
		defer sh.freeChunk(oldClass, oldOff) // after the slot stops pointing at it
	case len(hs) > maxHolders:
		return fmt.Errorf("kvindex: a block cannot have more than %d holders", maxHolders)
	default:
		class := oldClass
		// keep the chunk unless it is too small, or 4x too big
		if class < 1 || len(hs) > 1<<class || (class > 1 && len(hs) <= 1<<(class-2)) {
			class = 1
			for 1<<class < len(hs) {
				class++
			}
		}
		off := oldOff
		if class != oldClass {
			o, err := sh.alloc(class)
			switch {
			case err == nil:
				off = o
				defer sh.freeChunk(oldClass, oldOff)
			case oldClass >= 1 && len(hs) <= 1<<oldClass:
				class = oldClass // was only shrinking: keep the old chunk
			default:
				return err
			}
		}
		a := *sh.arena.Load()
		var sig uint64
		for j, x := range hs {
			sig += holderSig(x)
			atomic.StoreUint64(&a[off+1+j], x)
		}
		atomic.StoreUint64(&a[off], sig)
		nv = tagChunk | r | uint64(class)<<classShift | uint64(len(hs))<<countShift | uint64(off)
	}
	atomic.StoreUint64(&t[i*slotWords+1], nv)
	return nil
}

// add inserts holder hp for stored key sk. It reports whether a new entry was
// created and whether it is the pod's first live holder of the key.
func (sh *shard) add(idx *MemoryIndex, h, sk, hp uint64) (newEntry, newBlock bool, err error) {
	t := *sh.tab.Load()
	i, found := sh.find(t, h, sk)
	var hs []uint64
	podHad := false
	if found {
		all := sh.load(t, i)
		hs = sh.dropStale(idx, all)
		for _, x := range hs {
			if x&holderIdentMask == hp&holderIdentMask {
				// already held: write back any reclaimed stale holders and
				// mark the key recently stored
				if len(hs) != len(all) {
					return false, false, sh.storeOrRestore(t, i, hs, true, len(all))
				}
				if v := t[i*slotWords+1]; v&refBit == 0 {
					atomic.StoreUint64(&t[i*slotWords+1], v|refBit)
				}
				return false, false, nil
			}
			if holderPod(x) == holderPod(hp) {
				podHad = true
			}
		}
	}
	// Still full? Then nothing stale was dropped above (that would have
	// made room, as used never exceeds cap), so the slot is unchanged.
	if sh.used >= sh.cap {
		sh.evict(idx)
		// the sweep may have moved or dropped this key
		t = *sh.tab.Load()
		i, found = sh.find(t, h, sk)
		podHad = false
		if found {
			hs = sh.dropStale(idx, sh.load(t, i))
			for _, x := range hs {
				if holderPod(x) == holderPod(hp) {
					podHad = true
				}
			}
		}
	}
	if !found {
		if (sh.keys.Load()+1)*maxLoadDen > int64(len(t)/slotWords)*maxLoadNum {
			sh.grow()
			t = *sh.tab.Load()
			i, _ = sh.find(t, h, sk)
		}
		atomic.StoreUint64(&t[i*slotWords], sk)
		atomic.StoreUint64(&t[i*slotWords+1], tagInline|refBit|hp)
		sh.keys.Add(1)
		sh.used++
		return true, true, nil
	}
	n := valCount(t[i*slotWords+1])
	if t[i*slotWords+1]&tagMask == tagInline {
		n = 1
	}
	// keep the list sorted (by pod, since the pod is the top field): the
	// scorer diffs consecutive blocks' lists with a merge
	hs = append(hs, hp)
	for j := len(hs) - 1; j > 0 && hs[j-1] > hs[j]; j-- {
		hs[j-1], hs[j] = hs[j], hs[j-1]
	}
	sh.scratch = hs
	sh.used++
	if err := sh.storeOrRestore(t, i, hs, true, n); err != nil {
		return false, false, err
	}
	return true, !podHad, nil
}

// remove drops holder hp (same pod and tier) from stored key sk. It
// reports whether it was held and whether it was the pod's last holder of
// the key.
func (sh *shard) remove(idx *MemoryIndex, h, sk, hp uint64) (removed, lastOfPod bool, err error) {
	t := *sh.tab.Load()
	i, found := sh.find(t, h, sk)
	if !found {
		return false, false, nil
	}
	all := sh.load(t, i)
	n := len(all)
	hs := sh.dropStale(idx, all)
	w := 0
	lastOfPod = true
	for _, x := range hs {
		// The epoch counts here: a Remove that read the pod's epoch before
		// a ClearPod must not remove the holder the pod's next Add put in
		// after it (same pod and tier, the new epoch). Its count is skipped
		// (commit), so removing it left the pod's entry counter one high.
		if x == hp {
			removed = true
			continue
		}
		if holderPod(x) == holderPod(hp) {
			lastOfPod = false
		}
		hs[w] = x
		w++
	}
	if removed {
		sh.used--
	}
	if w == n {
		return false, false, nil
	}
	if err := sh.storeOrRestore(t, i, hs[:w], false, n); err != nil {
		return false, false, err
	}
	return removed, lastOfPod && removed, nil
}

// storeOrRestore is store, but when store fails (the slot is then unchanged)
// it resets the physical count to the slot's unchanged n holders.
func (sh *shard) storeOrRestore(t []uint64, i int, hs []uint64, ref bool, n int) error {
	err := sh.store(t, i, hs, ref)
	if err != nil {
		sh.used += int64(n - len(hs))
	}
	return err
}

// deleteSlot empties slot i, shifting later members of its probe run back so
// lookups never need tombstones.
func (sh *shard) deleteSlot(t []uint64, i int) {
	mask := len(t)/slotWords - 1
	j := i
	for {
		j = (j + 1) & mask
		v := t[j*slotWords+1]
		if v == 0 {
			break
		}
		home := int(mix64(t[j*slotWords])) & mask
		// the entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j]
		var stays bool
		if i <= j {
			stays = i < home && home <= j
		} else {
			stays = i < home || home <= j
		}
		if stays {
			continue
		}
		atomic.StoreUint64(&t[i*slotWords], t[j*slotWords])
		atomic.StoreUint64(&t[i*slotWords+1], v)
		i = j
	}
	atomic.StoreUint64(&t[i*slotWords+1], 0)
	atomic.StoreUint64(&t[i*slotWords], 0)
	sh.keys.Add(-1)
}

// alloc returns the offset of a free chunk of the given class.
func (sh *shard) alloc(class int) (int, error) {
	if fl := sh.free[class]; len(fl) > 0 {
		off := fl[len(fl)-1]
		sh.free[class] = fl[:len(fl)-1]
		return int(off), nil
	}
	size := chunkWords(class)
	if sh.arenaLen+size > maxArena {
		return 0, errFull
	}
	a := *sh.arena.Load()
	if sh.arenaLen+size > len(a) {
		// Grow by 1.5x: the arena is much of the index's memory, so
		// doubling's slack would cost more than the extra copying.
		n := min(max(len(a)+len(a)/2, sh.arenaLen+size, 256), maxArena)
		na := make([]uint64, n)
		adviseHuge(na)
		copy(na, a[:sh.arenaLen])
		sh.arena.Store(&na)
	}
	off := sh.arenaLen
	sh.arenaLen += size
	return off, nil
}

func (sh *shard) freeChunk(class, off int) {
	if class > 0 {
		sh.free[class] = append(sh.free[class], uint32(off))
	}
}

// grow doubles the slot table. The new table is filled before it is
// published, so plain writes are fine there.
//
// The caller holds mu with seq odd and has completed every store of its
// change so far, so the shard is in a consistent state. The copy only reads
// the published table (and never the arena), so grow makes seq even for
// its duration: lock-free readers go on reading the old table instead of
// waiting for the whole copy, milliseconds for a large shard (at GOMAXPROCS
// 2 those waits were the Mooncake replay's query p99). seq is odd again
// before the new table is published, and stays odd for the rest of the
// caller's change.
func (sh *shard) grow() {
	sh.seq.Add(1)
	old := *sh.tab.Load()
	n := 2 * len(old) / slotWords
	mask := n - 1
	nt := make([]uint64, n*slotWords)
	adviseHuge(nt)
	for i := 0; i < len(old)/slotWords; i++ {
		if old[i*slotWords+1] == 0 {
			continue
		}
		j := int(mix64(old[i*slotWords])) & mask
		for nt[j*slotWords+1] != 0 {
			j = (j + 1) & mask
		}
		nt[j*slotWords] = old[i*slotWords]
		nt[j*slotWords+1] = old[i*slotWords+1]
	}
	sh.seq.Add(1)
	sh.tab.Store(&nt)
	sh.hand = 0
}

// evict frees room in a full shard with a CLOCK sweep (see MemoryIndex).
func (sh *shard) evict(idx *MemoryIndex) {
	t := *sh.tab.Load()
	n := len(t) / slotWords
	for steps := 0; sh.used >= sh.cap && steps < 3*n; steps++ {
		if sh.hand >= n {
			sh.hand = 0
		}
		i := sh.hand
		v := t[i*slotWords+1]
		if v == 0 {
			sh.hand++
			continue
		}
		all := sh.load(t, i)
		if hs := sh.dropStale(idx, all); len(hs) != len(all) {
			// reclaim, then look at the slot again (it may now hold a
			// shifted-in key)
			_ = sh.store(t, i, hs, false) // shrinking never fails
			continue
		}
		if v&refBit != 0 {
			atomic.StoreUint64(&t[i*slotWords+1], v&^refBit)
			sh.hand++
			continue
		}
		sh.evictSlot(idx, t, i, all)
	}
}

// evictSlot drops slot i and its holders hs (all live), counting them.
func (sh *shard) evictSlot(idx *MemoryIndex, t []uint64, i int, hs []uint64) {
	idx.podMu.Lock()
	for r, x := range hs {
		p := holderPod(x)
		if idx.epochOf(p) != holderEpoch(x) {
			continue // cleared meanwhile: the clear already uncounted it
		}
		first := true
		for _, y := range hs[:r] {
			if holderPod(y) == p {
				first = false
				break
			}
		}
		c := idx.count(p)
		c.entries--
		if first {
			c.blocks--
		}
		if !c.evicted {
			c.evicted = true
			idx.evicted = append(idx.evicted, p)
			idx.anyEvicted.Store(true)
		}
		idx.live.Add(-1)
		idx.evictions.Add(1)
	}
	idx.podMu.Unlock()
	sh.used -= int64(len(hs))
	_ = sh.store(t, i, nil, false)
}
