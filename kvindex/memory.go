package kvindex

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/kvevents/event"
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
// sorted; fused scoring (ScorePrefix) uses both to skip blocks whose
// holders equal the previous block's and to diff those that differ. Chunks
// are recycled through per-class free lists. A holder is one packed
// uint64: pod (24 bits), pod epoch (27 bits), tier (2 bits). Nothing per
// entry is a Go pointer, so the GC never scans the index.
//
// Concurrency. Writers take the shard mutex per key and bump the shard's
// sequence counter around each change (a seqlock). Readers take no lock: they
// read the sequence, copy the slot and its holders with atomic loads (plain
// loads on amd64) and retry if the sequence moved. Tables and arenas are
// replaced, never resized in place, so a reader holding an old one reads
// stale but memory-safe words and then retries. Lookups cost a few loads per
// key; a reader that failed readSpins times in a row (a writer descheduled
// mid-change) waits for the shard's lock instead, blocking writers of that
// shard for one read.
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
//
// Files: memory.go holds this type, its configuration and the per-pod
// epochs and counters; memory_write.go the write path (Add, Remove);
// memory_read.go the lock-free read path (Lookup); memory_shard.go a
// shard's table, arena and eviction; memory_score.go fused scoring.
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
	// evicted lists the pods that lost a live entry to the capacity sweep
	// since TakeEvicted last drained it, each once (podCount.evicted);
	// anyEvicted lets TakeEvicted skip the lock when it is empty. Under
	// podMu; at most one entry per pod.
	evicted    []PodID
	anyEvicted atomic.Bool
	bufs       sync.Pool // *lookupBuf
	scores     sync.Pool // *memScore
}

// MemoryConfig configures NewMemoryIndex.
type MemoryConfig struct {
	// Capacity is the maximum number of (block, holder) entries kept
	// (MemoryOptions.Capacity; 0 = its default).
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

	// holder word: pod<<37 | epoch<<10 | tier<<8 (top 3 and low 8 bits zero)
	holderPodShift   = 37
	holderEpochShift = 10
	holderIdentMask  = ^(uint64(epochMask) << holderEpochShift) // pod, tier
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
	entries int64 // live (model, key, tier) holders of this pod
	evicted bool  // listed in MemoryIndex.evicted
}

var _ Index = (*MemoryIndex)(nil)

var (
	errBadTier = errors.New("kvindex: invalid tier")
	errBadPod  = fmt.Errorf("kvindex: pod id beyond %d", MaxPods-1)
	errFull    = errors.New("kvindex: shard arena exhausted (2^32 words)")
	// errShortHeld: AddHeld was given fewer held slots than keys.
	errShortHeld = errors.New("kvindex: AddHeld needs a held slot per key")
)

// NewMemoryIndex returns an empty in-memory index.
func NewMemoryIndex(cfg MemoryConfig) *MemoryIndex {
	capacity := cfg.Capacity
	if capacity <= 0 {
		capacity = MemoryOptions.Capacity.Default
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
	idx.scores.New = func() any { return new(memScore) }
	return idx
}

// holderSig is one holder's share of a chunk's holder-set signature (the sum
// of its holders' shares). mix64 maps 0 to 0, and holder word 0 is real (pod
// 0, epoch 0, GPU), so the word is offset by a bit no holder uses
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

// unmix64 inverts mix64: unmix64(mix64(x)) == x. Fused scoring uses it to
// recover the one holder by which two holder-set signatures differ.
func unmix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0x9cb4b2f8129337db // inverse of 0xc4ceb9fe1a85ec53 mod 2^64
	x ^= x >> 33
	x *= 0x4f74430c22a54005 // inverse of 0xff51afd7ed558ccd mod 2^64
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

func packHolder(pod PodID, epoch uint32, tier event.Tier) uint64 {
	return uint64(pod)<<holderPodShift | uint64(epoch&epochMask)<<holderEpochShift | uint64(tier&3)<<8
}

func holderPod(h uint64) PodID       { return PodID(h>>holderPodShift) & (MaxPods - 1) }
func holderEpoch(h uint64) uint32    { return uint32(h>>holderEpochShift) & epochMask }
func holderTier(h uint64) event.Tier { return event.Tier(h>>8) & 3 }

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
	*c = podCount{evicted: c.evicted} // still listed until TakeEvicted
	idx.podMu.Unlock()
	return nil
}

// PodBlocks is how many distinct blocks pod holds: a block cached on two
// tiers counts once.
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

// PodEntries is how many (block, tier) entries pod holds.
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

// PodsEntries is how many (block, tier) entries the pods hold together,
// read under one lock: a pod's share spans its DP ranks.
func (idx *MemoryIndex) PodsEntries(pods []PodID) int64 {
	idx.podMu.Lock()
	defer idx.podMu.Unlock()
	var n int64
	for _, pod := range pods {
		if pod < MaxPods {
			if c := idx.count(pod); c != nil {
				n += c.entries
			}
		}
	}
	return n
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

// TakeEvicted appends to dst the pods that lost entries to the capacity
// sweep since the last call (each once) and forgets them: the caller says
// so in their answers (the indexer marks their streams incomplete,
// "evicted_for_capacity"). One atomic load when no pod lost any.
func (idx *MemoryIndex) TakeEvicted(dst []PodID) []PodID {
	if !idx.anyEvicted.Load() {
		return dst
	}
	idx.podMu.Lock()
	defer idx.podMu.Unlock()
	for _, p := range idx.evicted {
		if c := idx.count(p); c != nil {
			c.evicted = false
		}
	}
	dst = append(dst, idx.evicted...)
	idx.evicted = idx.evicted[:0]
	idx.anyEvicted.Store(false)
	return dst
}

// Capacity is the configured bound on (block, holder) entries.
func (idx *MemoryIndex) Capacity() int64 { return idx.capacity }
