package kvindex

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// refIndex is the trivial reference the randomized test compares against.
type refIndex struct {
	holders map[refKey]map[Holder]bool
}

type refKey struct {
	m ModelID
	k blockkeys.Key
}

func (r *refIndex) add(m ModelID, p PodID, tier event.Tier, ks []blockkeys.Key) {
	for _, k := range ks {
		rk := refKey{m, k}
		if r.holders[rk] == nil {
			r.holders[rk] = map[Holder]bool{}
		}
		r.holders[rk][Holder{p, tier}] = true
	}
}

func (r *refIndex) remove(m ModelID, p PodID, tier event.Tier, ks []blockkeys.Key) {
	for _, k := range ks {
		delete(r.holders[refKey{m, k}], Holder{p, tier})
	}
}

func (r *refIndex) clear(p PodID) {
	for _, hs := range r.holders {
		for h := range hs {
			if h.Pod == p {
				delete(hs, h)
			}
		}
	}
}

func (r *refIndex) podBlocks(p PodID) (n int64) {
	for _, hs := range r.holders {
		for h := range hs {
			if h.Pod == p {
				n++
				break
			}
		}
	}
	return n
}

// TestMemoryIndexMatchesReference runs random operations (small key space,
// so keys collide, gain and lose holders, and chunks change size class)
// against MemoryIndex and a map-based reference, comparing everything
// observable after each step.
func TestMemoryIndexMatchesReference(t *testing.T) {
	ctx := context.Background()
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			idx := NewMemoryIndex(MemoryConfig{Capacity: 1 << 20})
			ref := &refIndex{holders: map[refKey]map[Holder]bool{}}
			const npods, nkeys = 12, 40
			for step := 0; step < 1500; step++ {
				m := ModelID(rng.IntN(2))
				p := PodID(rng.IntN(npods))
				tier := event.Tier(rng.IntN(int(event.NumStoredTiers)))
				ks := make([]blockkeys.Key, 1+rng.IntN(6))
				for i := range ks {
					ks[i] = blockkeys.Key(rng.IntN(nkeys))
				}
				switch r := rng.IntN(20); {
				case r < 11:
					if err := idx.Add(ctx, m, p, tier, ks); err != nil {
						t.Fatal(err)
					}
					ref.add(m, p, tier, ks)
				case r < 18:
					if err := idx.Remove(ctx, m, p, tier, ks); err != nil {
						t.Fatal(err)
					}
					ref.remove(m, p, tier, ks)
				default:
					if err := idx.ClearPod(ctx, p); err != nil {
						t.Fatal(err)
					}
					ref.clear(p)
				}
				if step%10 != 0 {
					continue
				}
				var total int64
				for mm := ModelID(0); mm < 2; mm++ {
					for k := blockkeys.Key(0); k < nkeys; k++ {
						var want []Holder
						for h := range ref.holders[refKey{mm, k}] {
							want = append(want, h)
						}
						slices.SortFunc(want, cmpHolder)
						total += int64(len(want))
						if got := holdersOf(t, idx, mm, k); !slices.Equal(got, want) {
							t.Fatalf("step %d model %d key %d: holders %v, want %v", step, mm, k, got, want)
						}
					}
				}
				for pp := PodID(0); pp < npods; pp++ {
					if got, want := podBlocks(t, idx, pp), ref.podBlocks(pp); got != want {
						t.Fatalf("step %d: PodBlocks(%d) = %d, want %d", step, pp, got, want)
					}
				}
				if got := idx.Stats().Entries; got != total {
					t.Fatalf("step %d: Entries = %d, want %d", step, got, total)
				}
				checkInvariants(t, idx)
			}
		})
	}
}
