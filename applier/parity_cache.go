package applier

import (
	"sync"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/setassoc"
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

type digestSet struct {
	setassoc.Set
	dig [setassoc.Ways][32]byte
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
	n, shift := setassoc.TableShape(entries)
	return &digestCache{shift: shift, sets: make([]digestSet, n)}
}

// get and put on a nil cache (a model over Limits.MaxDigestCaches)
// find nothing and keep nothing.
func (c *digestCache) get(k uint64, out *[32]byte) bool {
	if c == nil {
		return false
	}
	i := setassoc.SetIndex(k, c.shift)
	l := &c.locks[i%digestCacheLocks]
	l.Lock()
	s := &c.sets[i]
	w := s.Find(k)
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
	i := setassoc.SetIndex(k, c.shift)
	l := &c.locks[i%digestCacheLocks]
	l.Lock()
	s := &c.sets[i]
	w := s.Slot(k)
	s.dig[w] = *d
	s.Fill(w, k)
	l.Unlock()
}

type aliasSet struct {
	setassoc.Set
	vals [setassoc.Ways]blockkeys.Key
}

// aliasTable is owned by one pod's apply goroutine: no locking.
type aliasTable struct {
	shift uint
	sets  []aliasSet
}

func newAliasTable(entries int) *aliasTable {
	n, shift := setassoc.TableShape(entries)
	return &aliasTable{shift: shift, sets: make([]aliasSet, n)}
}

func (t *aliasTable) get(k uint64) (blockkeys.Key, bool) {
	s := &t.sets[setassoc.SetIndex(k, t.shift)]
	if w := s.Find(k); w >= 0 {
		return s.vals[w], true
	}
	return 0, false
}

func (t *aliasTable) put(k uint64, v blockkeys.Key) {
	s := &t.sets[setassoc.SetIndex(k, t.shift)]
	w := s.Slot(k)
	s.vals[w] = v
	s.Fill(w, k)
}
