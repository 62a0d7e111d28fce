package kvindex

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// MemoryIndex is the in-process Index backend.
//
// Layout. The index is split into up to 64 shards chosen by the high bits of
// a 64-bit mix of (model, key). Each shard is an open-addressing hash table
// (linear probing, backward-shift deletion, no tombstones, grown at 80% load)
// of 16-byte slots: the key XOR a per-model salt, and one value word that is
// either the key's only holder, inline, or a reference (size class, count,
// offset) to a chunk in the shard's arena. A chunk holds a signature word (a
// commutative hash of the holder set) and up to 2^class holder words kept
// sorted; the scorer uses both to skip blocks whose holders equal the
// previous block's and to diff those that differ. Chunks are recycled
// through per-class free lists. A holder is one packed uint64: pod (24
// bits), pod epoch (27 bits), tier (2 bits), group (8 bits). Nothing per
// entry is a Go pointer, so the GC never scans the index.
//
// Concurrency. Writers take the shard mutex per key and bump the shard's
// sequence counter around each change (a seqlock). Readers take no lock: they
// read the sequence, copy the slot and its holders with atomic loads (plain
// loads on amd64) and retry if the sequence moved. Tables and arenas are
// replaced, never resized in place, so a reader holding an old one reads
// stale but memory-safe words and then retries. Lookups never block writers
// and cost a few loads per key.
//
// Clearing a pod is O(1): ClearPod bumps the pod's epoch. A holder whose epoch
// differs from its pod's current epoch is invisible to Lookup; it is reclaimed
// the next time its key is written, or by the eviction sweep.
//
// Capacity. Capacity bounds the physical (block, holder) words, stale ones
// included, split evenly over the shards. When a shard is full, a CLOCK sweep
// over its slots frees room: it first drops stale holders (not counted as
// evictions), clears the reference bit of keys stored since the hand last
// passed, and evicts the first key whose bit is already clear, with all its
// holders (each live one counted in Stats().Evictions). This approximates
// "least recently stored first". Engines report their own evictions, so the
// bound is a safety net for lost BlockRemoved events, not the primary policy.
//
// Keys of different models share a table: the stored key is key XOR a salt
// derived from the model, so two (model, key) pairs collide only if their
// keys differ by exactly the salts' XOR, as unlikely as two blocks of one
// model colliding in the engine's own 64-bit keys.
type MemoryIndex struct {
	shards    []shard
	shardBits uint
	capacity  int64

	// epochs: a two-level table so an epoch's address never changes and
	// readers can load it without a lock. Pages are created on first use.
	epochs [podPages]atomic.Pointer[epochPage]

	podMu  sync.Mutex                       // guards counts; orders ClearPod against commits
	counts [podPages]*[podPageSize]podCount // paged like epochs; created with them
	live   atomic.Int64                     // live (block, holder) entries, all pods

	evictions atomic.Int64
	bufs      sync.Pool // *lookupBuf
}

// MemoryConfig configures NewMemoryIndex.
type MemoryConfig struct {
	// Capacity is the maximum number of (block, holder) entries kept. 0 means
	// DefaultMemoryCapacity.
	Capacity int64
}

// DefaultMemoryCapacity bounds the index at 8M (block, holder) entries,
// about 200 MiB with realistic prefix sharing.
const DefaultMemoryCapacity = 8 << 20

const (
	podBits   = 24
	epochBits = 27
	// MaxPods bounds PodIDs: a holder word has 24 bits for the pod.
	MaxPods     = 1 << podBits
	epochMask   = 1<<epochBits - 1
	podPageBits = 12
	podPageSize = 1 << podPageBits
	podPages    = MaxPods / podPageSize

	// holder word: pod<<37 | epoch<<10 | tier<<8 | group (top 3 bits zero)
	holderPodShift   = 37
	holderEpochShift = 10
	holderIdentMask  = ^(uint64(epochMask) << holderEpochShift) // pod, tier, group
	holderMask       = 1<<61 - 1

	// slot value word: tag<<62 | ref<<61 | (holder, or class<<56|count<<32|offset)
	tagMask    = uint64(3) << 62
	tagInline  = uint64(1) << 62
	tagChunk   = uint64(2) << 62
	refBit     = uint64(1) << 61
	classShift = 56
	classMask  = uint64(0x1f) << classShift
	countShift = 32
	countMask  = uint64(0xffffff) << countShift
	offMask    = uint64(0xffffffff)
	maxClass   = 24
	maxHolders = 1<<24 - 1 // count field width
	maxArena   = 1 << 32   // offset field width

	slotWords  = 2
	maxLoadNum = 4 // grow a table beyond 4/5 load
	maxLoadDen = 5
	maxShards  = 64
	// each shard gets at least this much capacity: small indexes (tests,
	// tiny fleets) get one shard and an exact bound
	minShardCapacity = 8192
)

type epochPage [podPageSize]atomic.Uint32

type podCount struct {
	blocks  int64 // distinct (model, key) with a live holder of this pod
	entries int64 // live (model, key, tier, group) holders of this pod
}

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

type lookupBuf struct {
	raw     []uint64
	holders []Holder
}

var _ Index = (*MemoryIndex)(nil)

var (
	errBadTier = errors.New("kvindex: invalid tier")
	errBadPod  = fmt.Errorf("kvindex: pod id beyond %d", MaxPods-1)
	errFull    = errors.New("kvindex: shard arena exhausted (2^32 words)")
)

// NewMemoryIndex returns an empty in-memory index.
func NewMemoryIndex(cfg MemoryConfig) *MemoryIndex {
	capacity := cfg.Capacity
	if capacity <= 0 {
		capacity = DefaultMemoryCapacity
	}
	bits := uint(0)
	for (1<<(bits+1)) <= maxShards && capacity>>(bits+1) >= minShardCapacity {
		bits++
	}
	n := 1 << bits
	idx := &MemoryIndex{shards: make([]shard, n), shardBits: bits, capacity: capacity}
	for i := range idx.shards {
		sh := &idx.shards[i]
		sh.cap = capacity / int64(n)
		if i < int(capacity%int64(n)) {
			sh.cap++
		}
		t := make([]uint64, 16*slotWords)
		sh.tab.Store(&t)
		a := []uint64{}
		sh.arena.Store(&a)
		sh.free = new([maxClass + 1][]uint32)
	}
	idx.bufs.New = func() any { return new(lookupBuf) }
	return idx
}

// holderSig is one holder's share of a chunk's holder-set signature (the sum
// of its holders' shares). mix64 maps 0 to 0, and holder word 0 is real (pod
// 0, epoch 0, GPU, group 0), so the word is offset by a bit no holder uses
// first: otherwise {0,1,3} and {1,3} would share a signature and the scorer
// would credit pod 0 with blocks it does not hold.
func holderSig(x uint64) uint64 {
	return mix64(x | 1<<63)
}

func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// modelSalt is XORed into a model's keys (see MemoryIndex). Callers compute
// it once per call, not per key.
func modelSalt(m ModelID) uint64 {
	return mix64(uint64(m) + 0x9e3779b97f4a7c15)
}

func (idx *MemoryIndex) shardOf(h uint64) *shard {
	return &idx.shards[h>>(64-idx.shardBits)&(1<<idx.shardBits-1)]
}

func packHolder(pod PodID, epoch uint32, tier Tier, group uint8) uint64 {
	return uint64(pod)<<holderPodShift | uint64(epoch&epochMask)<<holderEpochShift | uint64(tier&3)<<8 | uint64(group)
}

func holderPod(h uint64) PodID    { return PodID(h>>holderPodShift) & (MaxPods - 1) }
func holderEpoch(h uint64) uint32 { return uint32(h>>holderEpochShift) & epochMask }
func holderTier(h uint64) Tier    { return Tier(h>>8) & 3 }
func holderGroup(h uint64) uint8  { return uint8(h) }

func valCount(v uint64) int    { return int(v & countMask >> countShift) }
func valClass(v uint64) int    { return int(v & classMask >> classShift) }
func chunkWords(class int) int { return 1 + 1<<class }

// epochOf returns pod's current epoch. A pod's page is created before any
// of its holders is written, so a reader that finds a holder finds its page.
func (idx *MemoryIndex) epochOf(p PodID) uint32 {
	pg := idx.epochs[p>>podPageBits].Load()
	if pg == nil {
		return 0
	}
	return pg[p&(podPageSize-1)].Load()
}

func (idx *MemoryIndex) isLive(h uint64) bool {
	return idx.epochOf(holderPod(h)) == holderEpoch(h)
}

// ensurePod creates pod's epoch and counter pages.
func (idx *MemoryIndex) ensurePod(p PodID) {
	if idx.epochs[p>>podPageBits].Load() != nil {
		return
	}
	idx.podMu.Lock()
	if idx.epochs[p>>podPageBits].Load() == nil {
		idx.counts[p>>podPageBits] = new([podPageSize]podCount)
		idx.epochs[p>>podPageBits].Store(new(epochPage))
	}
	idx.podMu.Unlock()
}

// count returns pod p's counters (nil if the pod was never seen). Call with
// podMu held.
func (idx *MemoryIndex) count(p PodID) *podCount {
	if pg := idx.counts[p>>podPageBits]; pg != nil {
		return &pg[p&(podPageSize-1)]
	}
	return nil
}

// Add records that pod holds keys on tier/group. Adding a held
// (key, pod, tier, group) again changes nothing but its recency.
func (idx *MemoryIndex) Add(ctx context.Context, model ModelID, pod PodID, tier Tier, group uint8, keys []Key) error {
	if tier >= NumTiers {
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
	hp := packHolder(pod, epoch, tier, group)
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

// Remove forgets that pod holds keys on tier/group. Unknown keys are ignored.
func (idx *MemoryIndex) Remove(ctx context.Context, model ModelID, pod PodID, tier Tier, group uint8, keys []Key) error {
	if tier >= NumTiers {
		return errBadTier
	}
	if pod >= MaxPods {
		return errBadPod
	}
	if len(keys) == 0 || idx.epochs[pod>>podPageBits].Load() == nil {
		return nil
	}
	epoch := idx.epochOf(pod)
	hp := packHolder(pod, epoch, tier, group)
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

// ClearPod forgets everything pod holds by moving it to a new epoch: O(1).
// The 27-bit epoch wraps after 134M clears of one pod; a holder would have to
// survive untouched through all of them to become visible again.
func (idx *MemoryIndex) ClearPod(ctx context.Context, pod PodID) error {
	if pod >= MaxPods {
		return errBadPod
	}
	idx.ensurePod(pod)
	idx.podMu.Lock()
	e := &idx.epochs[pod>>podPageBits].Load()[pod&(podPageSize-1)]
	e.Store((e.Load() + 1) & epochMask)
	c := idx.count(pod)
	idx.live.Add(-c.entries)
	*c = podCount{}
	idx.podMu.Unlock()
	return nil
}

// PodBlocks is how many distinct blocks pod holds: a block cached on two
// tiers (or in two groups) counts once.
func (idx *MemoryIndex) PodBlocks(ctx context.Context, pod PodID) (int64, error) {
	idx.podMu.Lock()
	defer idx.podMu.Unlock()
	if pod < MaxPods {
		if c := idx.count(pod); c != nil {
			return c.blocks, nil
		}
	}
	return 0, nil
}

// PodEntries is how many (block, tier, group) entries pod holds.
func (idx *MemoryIndex) PodEntries(pod PodID) int64 {
	idx.podMu.Lock()
	defer idx.podMu.Unlock()
	if pod < MaxPods {
		if c := idx.count(pod); c != nil {
			return c.entries
		}
	}
	return 0
}

// Stats returns the index counters. Keys counts occupied slots, which
// includes keys whose holders all belong to cleared pods until reclaimed.
func (idx *MemoryIndex) Stats() IndexStats {
	var keys int64
	for i := range idx.shards {
		keys += idx.shards[i].keys.Load()
	}
	return IndexStats{Entries: idx.live.Load(), Keys: keys, Evictions: idx.evictions.Load()}
}

// Capacity is the configured bound on (block, holder) entries.
func (idx *MemoryIndex) Capacity() int64 { return idx.capacity }

// Lookup calls v.Visit for keys in order with each key's live holders,
// stopping at the first key without one or when Visit returns false.
func (idx *MemoryIndex) Lookup(ctx context.Context, model ModelID, keys []Key, v Visitor) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := idx.bufs.Get().(*lookupBuf)
	salt := modelSalt(model)
	for i, k := range keys {
		sk := uint64(k) ^ salt
		h := mix64(sk)
		b.raw, _, _, _ = idx.shardOf(h).read(h, sk, b.raw[:0], 0, false)
		hs := b.holders[:0]
		for _, h := range b.raw {
			if idx.isLive(h) {
				hs = append(hs, Holder{Pod: holderPod(h), Tier: holderTier(h), Group: holderGroup(h)})
			}
		}
		b.holders = hs
		if len(hs) == 0 || !v.Visit(i, k, hs) {
			break
		}
	}
	idx.bufs.Put(b)
	return nil
}

// read appends a consistent copy of the packed holders of stored key sk
// (hashed h, in this shard), stale ones included, to dst, and returns the
// holder set's signature. When skip is set and the signature equals
// skipSig, it copies nothing and reports same. Lock-free: see MemoryIndex.
func (sh *shard) read(h, sk uint64, dst []uint64, skipSig uint64, skip bool) (out []uint64, sig uint64, found, same bool) {
	for spins := 0; ; spins++ {
		s1 := sh.seq.Load()
		if s1&1 == 0 {
			v := sh.probe(h, sk)
			switch {
			case v == 0:
				if sh.seq.Load() == s1 {
					return dst, 0, false, false
				}
			case v&tagMask == tagInline:
				if sh.seq.Load() == s1 {
					sig = v &^ refBit
					if skip && sig == skipSig {
						return dst, sig, true, true
					}
					return append(dst, v&holderMask), sig, true, false
				}
			default:
				if out, sig, ok := sh.readChunk(v, dst, skipSig, skip); ok && sh.seq.Load() == s1 {
					return out, sig, true, skip && sig == skipSig
				}
			}
		}
		if spins > 16 {
			runtime.Gosched() // the writer may have been descheduled
		}
	}
}

// probe returns the value word of stored key sk (0 if absent). The caller
// validates it with the shard's sequence number.
func (sh *shard) probe(h, sk uint64) uint64 {
	t := *sh.tab.Load()
	mask := uint64(len(t)/slotWords - 1)
	i := h & mask
	for n := uint64(0); n <= mask; n++ {
		j := i * slotWords
		if j+1 >= uint64(len(t)) {
			return 0
		}
		v := atomic.LoadUint64(&t[j+1])
		if v == 0 || atomic.LoadUint64(&t[j]) == sk {
			return v
		}
		i = (i + 1) & mask
	}
	return 0
}

// readChunk copies the holders of chunk value v unless their signature
// equals skipSig. ok is false for a torn (inconsistent) value.
func (sh *shard) readChunk(v uint64, dst []uint64, skipSig uint64, skip bool) (out []uint64, sig uint64, ok bool) {
	if v&tagMask != tagChunk {
		return dst, 0, false
	}
	c, off := uint64(valCount(v)), v&offMask
	a := *sh.arena.Load()
	if c > 1<<valClass(v) || off+1+c > uint64(len(a)) {
		return dst, 0, false
	}
	sig = atomic.LoadUint64(&a[off])
	if skip && sig == skipSig {
		return dst, sig, true
	}
	for j := off + 1; j <= off+c; j++ {
		dst = append(dst, atomic.LoadUint64(&a[j]))
	}
	return dst, sig, true
}

// touch loads the home slot of hashed key h so that a later read finds it
// in cache. The load is atomic, so it stays even though its value is unused.
func (sh *shard) touch(h uint64) {
	t := *sh.tab.Load()
	i := int(h) & (len(t)/slotWords - 1)
	atomic.LoadUint64(&t[i*slotWords+1])
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

// remove drops holder hp (same pod, tier, group) from stored key sk. It
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
		if x&holderIdentMask == hp&holderIdentMask {
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
func (sh *shard) grow() {
	old := *sh.tab.Load()
	n := 2 * len(old) / slotWords
	mask := n - 1
	nt := make([]uint64, n*slotWords)
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
		idx.live.Add(-1)
		idx.evictions.Add(1)
	}
	idx.podMu.Unlock()
	sh.used -= int64(len(hs))
	_ = sh.store(t, i, nil, false)
}
