package kvindex

import (
	"sync"
)

// Two bounded, allocation-free tables back the live parity check:
//
//   - digestCache (one per model, shared by that model's pods): engine block
//     hash -> OUR 32-byte digest of that block. A BlockStored event names its
//     parent only by the engine's 64-bit hash; to hash the next block ourselves
//     we need our full digest of the parent, which this cache remembers.
//   - aliasTable (one per pod, created when the pod first needs it): engine
//     block hash -> our key, for pods whose hashes differ from ours (seed,
//     algorithm, SGLang). Blocks are indexed under our key and BlockRemoved,
//     which only carries the engine's hash, is translated back through it.
//
// Both are 4-way set-associative hash tables of fixed size: a lookup touches one
// set, an insert into a full set replaces the set's entries round-robin
// (approximately oldest first), memory never grows after construction, and
// nothing is allocated per block. Losing an entry only costs precision: a
// child block whose parent digest was evicted is counted as unverified, a
// removal whose alias was evicted is counted as unresolved.

const cacheWays = 4

// setIndex spreads engine hashes over sets. Engine hashes are usually digests
// already, but older engines sent Python hash() ints, which are not uniform.
func setIndex(k uint64, shift uint) uint64 {
	return (k * 0x9E3779B97F4A7C15) >> shift
}

// tableShape rounds entries up to a power-of-two number of sets.
func tableShape(entries int) (sets int, shift uint) {
	if entries < cacheWays {
		entries = cacheWays
	}
	sets, shift = 1, 64
	for sets*cacheWays < entries {
		sets <<= 1
		shift--
	}
	return sets, shift
}

// ways is the key part of one set, shared by both tables.
type ways struct {
	keys  [cacheWays]uint64
	valid uint8
	next  uint8
}

// find returns the way holding k, or -1.
func (s *ways) find(k uint64) int {
	for w := 0; w < cacheWays; w++ {
		if s.valid&(1<<w) != 0 && s.keys[w] == k {
			return w
		}
	}
	return -1
}

// slot picks the way for k: its current way, else a free one, else
// round-robin. The caller stores its value there, then calls fill.
func (s *ways) slot(k uint64) int {
	free := -1
	for w := 0; w < cacheWays; w++ {
		if s.valid&(1<<w) == 0 {
			if free < 0 {
				free = w
			}
		} else if s.keys[w] == k {
			return w
		}
	}
	if free >= 0 {
		return free
	}
	w := int(s.next)
	s.next = uint8((w + 1) % cacheWays)
	return w
}

// fill marks way w as holding k.
func (s *ways) fill(w int, k uint64) {
	s.keys[w] = k
	s.valid |= 1 << w
}

type digestSet struct {
	ways
	dig [cacheWays][32]byte
}

// digestCacheLocks stripes the locks of a digestCache: the model's pods apply
// on several workers at once, and a lock per set would waste memory.
const digestCacheLocks = 64

type digestCache struct {
	shift uint
	sets  []digestSet
	locks [digestCacheLocks]struct {
		sync.Mutex
		_ [56]byte // keep stripes on separate cache lines
	}
}

func newDigestCache(entries int) *digestCache {
	n, shift := tableShape(entries)
	return &digestCache{shift: shift, sets: make([]digestSet, n)}
}

// get and put on a nil cache (a model over ApplierLimits.MaxDigestCaches)
// find nothing and keep nothing.
func (c *digestCache) get(k uint64, out *[32]byte) bool {
	if c == nil {
		return false
	}
	i := setIndex(k, c.shift)
	l := &c.locks[i%digestCacheLocks]
	l.Lock()
	s := &c.sets[i]
	w := s.find(k)
	if w >= 0 {
		*out = s.dig[w]
	}
	l.Unlock()
	return w >= 0
}

func (c *digestCache) put(k uint64, d *[32]byte) {
	if c == nil {
		return
	}
	i := setIndex(k, c.shift)
	l := &c.locks[i%digestCacheLocks]
	l.Lock()
	s := &c.sets[i]
	w := s.slot(k)
	s.dig[w] = *d
	s.fill(w, k)
	l.Unlock()
}

type aliasSet struct {
	ways
	vals [cacheWays]Key
}

// aliasTable is owned by one pod's apply goroutine: no locking.
type aliasTable struct {
	shift uint
	sets  []aliasSet
}

func newAliasTable(entries int) *aliasTable {
	n, shift := tableShape(entries)
	return &aliasTable{shift: shift, sets: make([]aliasSet, n)}
}

func (t *aliasTable) get(k uint64) (Key, bool) {
	s := &t.sets[setIndex(k, t.shift)]
	if w := s.find(k); w >= 0 {
		return s.vals[w], true
	}
	return 0, false
}

func (t *aliasTable) put(k uint64, v Key) {
	s := &t.sets[setIndex(k, t.shift)]
	w := s.slot(k)
	s.vals[w] = v
	s.fill(w, k)
}
