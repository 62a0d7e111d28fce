package applier

import (
	"sync/atomic"
	"unsafe"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/setassoc"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/prometheus/client_golang/prometheus"
)

// Two per-pod tables let the applier keep the engines' semantics without
// asking the index what it holds (an index read per block would cost a Redis
// round trip):
//
//   - copyTable (vLLM pods): (key, tier, group) -> number of announcements
//     stored and not yet removed, on every tier (the GPU tier only until the
//     engine sends remaining_copy_counts). vLLM can cache one hash in two
//     GPU blocks (two requests computing the same block at once) and reports
//     each; its offloading connector announces a hash once per chunk holding
//     it. Removing one announcement must not unindex the block.
//   - maskTable (pods with more than one full-attention group): (key, tier) ->
//     bit set of the full-attention groups holding it; the block is indexed
//     only while every such group holds it.
//
// Both are countTables: 4-way set-associative, no allocation per block once
// grown. A table starts at minCountTableEntries and doubles when a new key
// finds its set full, up to its cap: a pod that stores 200 blocks holds a
// few KB, not the cap's ~790 KB (2,000 such pods held 2.4 GB when tables were
// allocated at full size). Growing never loses an entry: doubling splits each
// set in two (the set index gains its next hash bit), so the up-to-4 entries
// of a set land in two sets of 4. Losing an entry to the cap only loses precision in the safe
// direction: a forgotten copy count means the next removal unindexes the
// block (today's behaviour without counts), a forgotten mask means the block
// is re-indexed only when every group stores it again. Neither can leave a
// block indexed that the pod no longer holds.

// DefaultCopyTableSize and DefaultGroupMaskTableSize bound each pod's tables
// (entries, 12 bytes each: ~790 KB per table at the cap).
const (
	DefaultCopyTableSize      = 1 << 16
	DefaultGroupMaskTableSize = 1 << 16
)

// minCountTableEntries is a new table's size (16 sets, 768 bytes).
const minCountTableEntries = 64

// DefaultHoldTableBytes bounds the memory of all copy-count and group-mask
// tables together. Sized by use, a table still reaches its cap when its pod
// stores (and removes) 65,536 distinct blocks, and 10,000 streams at their
// caps would be ~16 GB: past this budget tables stop growing and replace
// entries instead (precision lost in the safe direction, counted in
// hold_table_evictions_total). New tables (768 bytes) are always created.
const DefaultHoldTableBytes = 256 << 20

// tableBudget is the memory of all count tables against their limit,
// exported as kvindexd_hold_table_bytes.
type tableBudget struct {
	used  atomic.Int64
	limit int64
	gauge prometheus.Gauge
}

// add charges n bytes (negative: frees), refusing growth past the limit
// when must is false.
func (b *tableBudget) add(n int64, must bool) bool {
	if b == nil {
		return true
	}
	if u := b.used.Add(n); !must && n > 0 && u > b.limit {
		b.used.Add(-n)
		return false
	}
	b.gauge.Add(float64(n))
	return true
}

type countSet struct {
	setassoc.Set
	vals [setassoc.Ways]uint16
}

type countTable struct {
	shift   uint
	sets    []countSet
	maxSets int
	// budget, when set, accounts all tables' memory and bounds growth.
	budget *tableBudget
}

// countSetBytes is the memory of one set.
const countSetBytes = int64(unsafe.Sizeof(countSet{}))

// newCountTable returns a table of at most entries entries (rounded up to a
// power-of-two number of sets), starting small.
func newCountTable(entries int, budget *tableBudget) *countTable {
	maxSets, _ := setassoc.TableShape(entries)
	n, shift := setassoc.TableShape(min(entries, minCountTableEntries))
	budget.add(int64(n)*countSetBytes, true)
	return &countTable{shift: shift, sets: make([]countSet, n), maxSets: maxSets, budget: budget}
}

// release returns the table's memory to the budget; the caller drops it.
func (t *countTable) release() {
	if t != nil {
		t.budget.add(-int64(len(t.sets))*countSetBytes, true)
		t.sets = nil
	}
}

// grow doubles the table, or reports false when the budget refuses. Set i's
// entries move to sets 2i and 2i+1 (the index gains the next bit of the same
// product), at most 4 each: none is lost, and each way keeps its value.
func (t *countTable) grow() bool {
	if !t.budget.add(int64(len(t.sets))*countSetBytes, false) {
		return false
	}
	old := t.sets
	t.sets, t.shift = make([]countSet, 2*len(old)), t.shift-1
	for i := range old {
		o := &old[i]
		for w := 0; w < setassoc.Ways; w++ {
			if o.Valid&(1<<w) == 0 {
				continue
			}
			k := o.Keys[w]
			s := &t.sets[setassoc.SetIndex(k, t.shift)]
			nw := s.Slot(k)
			s.vals[nw] = o.vals[w]
			s.Fill(nw, k)
		}
	}
	return true
}

func (t *countTable) get(k uint64) (uint16, bool) {
	s := &t.sets[setassoc.SetIndex(k, t.shift)]
	if w := s.Find(k); w >= 0 {
		return s.vals[w], true
	}
	return 0, false
}

// put stores v for k and reports whether a valid entry was replaced for it.
// When the set is full it replaces an entry holding 1 (a single copy:
// cheapest to forget) before falling back to round-robin.
func (t *countTable) put(k uint64, v uint16) (evicted bool) {
	s := &t.sets[setassoc.SetIndex(k, t.shift)]
	w := s.Find(k)
	for w < 0 && s.Valid == 1<<setassoc.Ways-1 && len(t.sets) < t.maxSets && t.grow() {
		s = &t.sets[setassoc.SetIndex(k, t.shift)]
	}
	if w < 0 && s.Valid == 1<<setassoc.Ways-1 {
		for i := 0; i < setassoc.Ways; i++ {
			if s.vals[i] == 1 {
				w = i
				break
			}
		}
		if w < 0 {
			w = s.Slot(k)
		}
		evicted = true
	} else if w < 0 {
		w = s.Slot(k)
	}
	s.vals[w] = v
	s.Fill(w, k)
	return evicted
}

func (t *countTable) del(k uint64) {
	s := &t.sets[setassoc.SetIndex(k, t.shift)]
	if w := s.Find(k); w >= 0 {
		s.Valid &^= 1 << w
	}
}

// entryKey folds tier and group into a block key, so one table serves every
// (tier, group) without a wider key. Distinct inputs collide only as 64-bit
// hashes do.
func entryKey(k blockkeys.Key, tier event.Tier, group int) uint64 {
	return uint64(k) ^ (uint64(tier)+1)*0x9E3779B97F4A7C15 ^ (uint64(group)+1)*0xC2B2AE3D27D4EB4F
}
