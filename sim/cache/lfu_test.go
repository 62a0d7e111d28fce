package cache

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// refLFU is LFU by definition, with a linear scan instead of a heap: evict
// the lowest count, ties to the least recent access.
type refLFU struct {
	cap        int
	now        uint64
	freq, tick map[uint64]uint64
}

func (r *refLFU) access(h uint64) (evicted []uint64) {
	r.now++
	if _, ok := r.freq[h]; ok {
		r.freq[h]++
		r.tick[h] = r.now
		return nil
	}
	if len(r.freq) >= r.cap {
		var v uint64
		first := true
		for k := range r.freq {
			if first || r.freq[k] < r.freq[v] || (r.freq[k] == r.freq[v] && r.tick[k] < r.tick[v]) {
				v, first = k, false
			}
		}
		delete(r.freq, v)
		delete(r.tick, v)
		evicted = append(evicted, v)
	}
	r.freq[h], r.tick[h] = 1, r.now
	return evicted
}

// The heap gives the same evictions as the definition on long random
// traces with many blocks, repeated hits and every capacity from 1 to 9
// (a heap bug shows only once nodes sit below the root's children).
func TestLFUHeapMatchesDefinition(t *testing.T) {
	for capacity := 1; capacity <= 9; capacity++ {
		c := NewLFU(capacity)
		ref := &refLFU{cap: capacity, freq: map[uint64]uint64{}, tick: map[uint64]uint64{}}
		rng := rand.New(rand.NewPCG(uint64(capacity), 5))
		for step := 0; step < 5000; step++ {
			// a skewed key space: some blocks hot, most cold
			h := uint64(rng.IntN(3 * capacity))
			if rng.IntN(3) == 0 {
				h = uint64(rng.IntN(capacity/2 + 1))
			}
			got := c.Access(h, nil)
			want := ref.access(h)
			if !slices.Equal(got, want) {
				t.Fatalf("capacity %d step %d access %d: evicted %v, want %v", capacity, step, h, got, want)
			}
			if c.Len() != len(ref.freq) {
				t.Fatalf("capacity %d step %d: Len %d, want %d", capacity, step, c.Len(), len(ref.freq))
			}
		}
	}
}
