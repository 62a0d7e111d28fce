package indexer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/zeebo/xxh3"
)

// memSpec is the in-process SpeculativeStore.
type memSpec struct {
	h   *holdMap
	now func() time.Time
}

func (m *memSpec) Extend(_ context.Context, model string, keys []blockkeys.Key, holders []uint64, start, ext []int32) error {
	m.h.extend(modelHash(model), keys, holders, start, ext, m.now().UnixNano())
	return nil
}

func (m *memSpec) Hold(_ context.Context, model string, keys []blockkeys.Key, holder uint64) error {
	m.h.hold(modelHash(model), keys, holder, m.now().UnixNano())
	return nil
}

func (m *memSpec) Drop(_ context.Context, model string, keys []blockkeys.Key, holders [2]uint64) error {
	mh := modelHash(model)
	m.h.drop(mh, keys, holders[0])
	m.h.drop(mh, keys, holders[1])
	return nil
}

// holdWays is how many pods one block can be assumed held by at once; a
// fifth holder replaces the one whose entry expires first.
const holdWays = 4

// holdKey is one block of one model. Models are hashed rather than
// interned: a router may name a model no engine has published for yet, and
// hashing keeps these maps from growing the shared interner.
type holdKey struct {
	model uint64
	key   blockkeys.Key
}

type holdSlot struct {
	pod uint64 // holderID; 0 = free
	exp int64  // unix nanos
}

type holdRec struct {
	k   holdKey
	pod uint64
	exp int64
}

// holdMap records "pod is assumed to hold block until exp" from the
// daemon's own picks, not from engine events: the speculative entries of
// pods with events (short TTL, until their BlockStored arrives) and the
// routing history of pods without (long TTL). It is bounded: every entry
// written is also queued in a ring of cap records, in expiry order since
// the TTL is constant; expired records are reclaimed from its head on every
// write, and a full ring evicts its oldest record first (counted).
type holdMap struct {
	ttl int64
	mu  sync.RWMutex
	m   map[holdKey][holdWays]holdSlot
	// ring holds cap records; head is the oldest, n how many are queued.
	ring    []holdRec
	head, n int
	// live counts occupied slots, expired ones included until the ring
	// reclaims them (read without the lock by Pick's fast path and the
	// metrics).
	live      atomic.Int64
	evictions atomic.Int64
}

func newHoldMap(ttlNanos int64, capacity int) *holdMap {
	return &holdMap{ttl: ttlNanos, m: make(map[holdKey][holdWays]holdSlot), ring: make([]holdRec, capacity)}
}

// holderID names a (pod, DP rank) in the hold maps and the shared
// speculative store; rank -1 is "the pod, rank not given". It is a hash so
// daemons sharing a store agree on it without a shared table.
func holderID(pod string, rank int) uint64 {
	h := xxh3.HashString(pod) ^ (uint64(rank+2) * 0x9e3779b97f4a7c15)
	if h == 0 {
		h = 1 // 0 means "no holder"
	}
	return h
}

func modelHash(model string) uint64 { return xxh3.HashString(model) }

// hold records pod for keys until now+ttl.
func (h *holdMap) hold(model uint64, keys []blockkeys.Key, pod uint64, now int64) {
	exp := now + h.ttl
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reclaim(now)
	for _, k := range keys {
		hk := holdKey{model, k}
		slots := h.m[hk]
		at, oldest := -1, 0
		for i := range slots {
			s := &slots[i]
			if s.pod == pod || s.pod == 0 || s.exp <= now {
				at = i
				break
			}
			if s.exp < slots[oldest].exp {
				oldest = i
			}
		}
		switch {
		case at < 0:
			// A live holder is displaced (one entry out, one in); its ring
			// record goes stale.
			at = oldest
			h.evictions.Add(1)
		case slots[at].pod == 0:
			h.live.Add(1)
		}
		// Otherwise a refresh or an expired slot reused: its old record is
		// stale now and the count is unchanged.
		slots[at] = holdSlot{pod, exp}
		h.m[hk] = slots
		if h.n == len(h.ring) {
			h.popOldest(now)
		}
		h.ring[(h.head+h.n)%len(h.ring)] = holdRec{hk, pod, exp}
		h.n++
	}
}

// reclaim drops expired records from the ring's head.
func (h *holdMap) reclaim(now int64) {
	for h.n > 0 && h.ring[h.head].exp <= now {
		h.popOldest(now)
	}
}

// popOldest removes the ring's oldest record and its slot, unless the slot
// was refreshed or reused since (then the record is stale).
func (h *holdMap) popOldest(now int64) {
	r := h.ring[h.head]
	h.ring[h.head] = holdRec{}
	h.head = (h.head + 1) % len(h.ring)
	h.n--
	slots, ok := h.m[r.k]
	if !ok {
		return
	}
	empty := true
	for i := range slots {
		s := &slots[i]
		if s.pod == r.pod && s.exp == r.exp {
			if r.exp > now {
				h.evictions.Add(1)
			}
			*s = holdSlot{}
			h.live.Add(-1)
		}
		if s.pod != 0 {
			empty = false
		}
	}
	if empty {
		delete(h.m, r.k)
	} else {
		h.m[r.k] = slots
	}
}

// drop forgets pod's entries for keys (its real events arrived).
func (h *holdMap) drop(model uint64, keys []blockkeys.Key, pod uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		hk := holdKey{model, k}
		slots, ok := h.m[hk]
		if !ok {
			continue
		}
		for i := range slots {
			if slots[i].pod == pod {
				slots[i] = holdSlot{}
				h.live.Add(-1)
			}
		}
		// the ring record stays; popOldest finds no matching slot
		h.m[hk] = slots
	}
}

// holds reports whether pod holds (model, k) at now. The caller holds mu.
func (h *holdMap) holdsLocked(hk holdKey, pod uint64, now int64) bool {
	slots, ok := h.m[hk]
	if !ok {
		return false
	}
	for i := range slots {
		if slots[i].pod == pod && slots[i].exp > now {
			return true
		}
	}
	return false
}

// extend sets ext[i] to how many blocks from start[i] holder[i] holds in a
// row (speculative entries continue a pod's indexed run).
func (h *holdMap) extend(model uint64, keys []blockkeys.Key, holders []uint64, start, ext []int32, now int64) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	missAt := int32(-1) // a position known to have no live entry at all
	for i, pod := range holders {
		k := start[i]
		n := int32(0)
		for int(k) < len(keys) && k != missAt {
			hk := holdKey{model, keys[k]}
			if h.holdsLocked(hk, pod, now) {
				n++
				k++
				continue
			}
			if _, ok := h.m[hk]; !ok {
				missAt = k
			}
			break
		}
		ext[i] = n
	}
}

// walk sets run[i] for every candidate slot i that table maps a live holder
// to: how many leading blocks of keys it holds, walking the keys once and
// stopping at the first block no candidate extends.
func (h *holdMap) walk(model uint64, keys []blockkeys.Key, t *holderTable, run []int32, now int64) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for k := range keys {
		slots, ok := h.m[holdKey{model, keys[k]}]
		if !ok {
			return
		}
		alive := false
		for s := range slots {
			if slots[s].pod == 0 || slots[s].exp <= now {
				continue
			}
			if i := t.get(slots[s].pod); i >= 0 && run[i] == int32(k) {
				run[i]++
				alive = true
			}
		}
		if !alive {
			return
		}
	}
}

func (h *holdMap) len() int64 { return h.live.Load() }

// holderTable maps holderIDs to candidate positions for one Pick: open
// addressing over a reused array, so lookups during a walk cost no hashing
// of names and building it allocates nothing once warm.
type holderTable struct {
	keys []uint64
	vals []int32
	mask uint64
}

func (t *holderTable) reset(n int) {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	if cap(t.keys) < size {
		t.keys, t.vals = make([]uint64, size), make([]int32, size)
	}
	t.keys, t.vals = t.keys[:size], t.vals[:size]
	clear(t.keys)
	t.mask = uint64(size - 1)
}

// put adds id -> i; false if id is already present (a duplicate candidate).
func (t *holderTable) put(id uint64, i int32) bool {
	for p := id & t.mask; ; p = (p + 1) & t.mask {
		switch t.keys[p] {
		case 0:
			t.keys[p], t.vals[p] = id, i
			return true
		case id:
			return false
		}
	}
}

func (t *holderTable) get(id uint64) int32 {
	for p := id & t.mask; ; p = (p + 1) & t.mask {
		switch t.keys[p] {
		case 0:
			return -1
		case id:
			return t.vals[p]
		}
	}
}
