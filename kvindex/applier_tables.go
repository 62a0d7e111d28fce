package kvindex

// Two per-pod tables let the applier keep the engines' semantics without
// asking the index what it holds (an index read per block would cost a Redis
// round trip):
//
//   - copyTable (vLLM pods whose BlockRemoved carries no remaining_copy_counts):
//     (key, tier, group) -> number of physical copies stored, GPU tier only. vLLM can cache
//     one hash in two blocks (two requests computing the same block at once)
//     and reports each; removing one copy must not unindex the block.
//   - maskTable (pods with more than one full-attention group): (key, tier) ->
//     bit set of the full-attention groups holding it; the block is indexed
//     only while every such group holds it.
//
// Both are countTables: 4-way set-associative, fixed size, no allocation per
// block. Losing an entry to capacity only loses precision in the safe
// direction: a forgotten copy count means the next removal unindexes the
// block (today's behaviour without counts), a forgotten mask means the block
// is re-indexed only when every group stores it again. Neither can leave a
// block indexed that the pod no longer holds.

// DefaultCopyTableSize and DefaultGroupMaskTableSize bound each pod's tables
// (entries, ~10.5 bytes each: ~690 KB per table).
const (
	DefaultCopyTableSize      = 1 << 16
	DefaultGroupMaskTableSize = 1 << 16
)

type countSet struct {
	ways
	vals [cacheWays]uint16
}

type countTable struct {
	shift uint
	sets  []countSet
}

func newCountTable(entries int) *countTable {
	n, shift := tableShape(entries)
	return &countTable{shift: shift, sets: make([]countSet, n)}
}

func (t *countTable) get(k uint64) (uint16, bool) {
	s := &t.sets[setIndex(k, t.shift)]
	if w := s.find(k); w >= 0 {
		return s.vals[w], true
	}
	return 0, false
}

// put stores v for k and reports whether a valid entry was replaced for it.
// When the set is full it replaces an entry holding 1 (a single copy:
// cheapest to forget) before falling back to round-robin.
func (t *countTable) put(k uint64, v uint16) (evicted bool) {
	s := &t.sets[setIndex(k, t.shift)]
	w := s.find(k)
	if w < 0 && s.valid == 1<<cacheWays-1 {
		for i := 0; i < cacheWays; i++ {
			if s.vals[i] == 1 {
				w = i
				break
			}
		}
		if w < 0 {
			w = s.slot(k)
		}
		evicted = true
	} else if w < 0 {
		w = s.slot(k)
	}
	s.vals[w] = v
	s.fill(w, k)
	return evicted
}

func (t *countTable) del(k uint64) {
	s := &t.sets[setIndex(k, t.shift)]
	if w := s.find(k); w >= 0 {
		s.valid &^= 1 << w
	}
}

// entryKey folds tier and group into a block key, so one table serves every
// (tier, group) without a wider key. Distinct inputs collide only as 64-bit
// hashes do.
func entryKey(k Key, tier Tier, group int) uint64 {
	return uint64(k) ^ (uint64(tier)+1)*0x9E3779B97F4A7C15 ^ (uint64(group)+1)*0xC2B2AE3D27D4EB4F
}
