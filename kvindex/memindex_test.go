package kvindex

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// checkInvariants walks every shard (white box, so no writer may run) and
// checks what the index's bookkeeping promises: every key is reachable from
// its home slot, chunk signatures match their holders, no holder identity is
// duplicated, the physical and key counters are exact, and the per-pod and
// global live counters equal what the live holders say.
func checkInvariants(t *testing.T, idx *MemoryIndex) {
	t.Helper()
	type pk struct {
		p  PodID
		sk uint64
	}
	entries := map[PodID]int64{}
	blocks := map[pk]bool{}
	var live int64
	for s := range idx.shards {
		sh := &idx.shards[s]
		tab := *sh.tab.Load()
		a := *sh.arena.Load()
		var used, keys int64
		for i := 0; i < len(tab)/slotWords; i++ {
			v := tab[i*slotWords+1]
			if v == 0 {
				continue
			}
			keys++
			sk := tab[i*slotWords]
			h := mix64(sk)
			if &idx.shards[s] != idx.shardOf(h) {
				t.Fatalf("shard %d slot %d: key in wrong shard", s, i)
			}
			if j, ok := sh.find(tab, h, sk); !ok || j != i {
				t.Fatalf("shard %d slot %d: key not reachable from its home (found %d %v)", s, i, j, ok)
			}
			var hs []uint64
			switch v & tagMask {
			case tagInline:
				hs = []uint64{v & holderMask}
			case tagChunk:
				off, c := int(v&offMask), valCount(v)
				if c < 2 || c > 1<<valClass(v) || off+1+c > sh.arenaLen {
					t.Fatalf("shard %d slot %d: bad chunk ref %#x", s, i, v)
				}
				hs = a[off+1 : off+1+c]
				var sig uint64
				for _, x := range hs {
					sig += holderSig(x)
				}
				if sig != a[off] {
					t.Fatalf("shard %d slot %d: stale signature", s, i)
				}
			default:
				t.Fatalf("shard %d slot %d: bad tag %#x", s, i, v)
			}
			if !slices.IsSorted(hs) {
				t.Fatalf("shard %d slot %d: holders not sorted: %x", s, i, hs)
			}
			used += int64(len(hs))
			seen := map[uint64]bool{}
			for _, x := range hs {
				if !idx.isLive(x) {
					continue
				}
				if seen[x&holderIdentMask] {
					t.Fatalf("shard %d slot %d: duplicate live holder %#x", s, i, x)
				}
				seen[x&holderIdentMask] = true
				live++
				entries[holderPod(x)]++
				blocks[pk{holderPod(x), sk}] = true
			}
		}
		if used != sh.used {
			t.Fatalf("shard %d: used counter %d, holders %d", s, sh.used, used)
		}
		if used > sh.cap {
			t.Fatalf("shard %d: %d holders above capacity %d", s, used, sh.cap)
		}
		if keys != sh.keys.Load() {
			t.Fatalf("shard %d: keys counter %d, slots %d", s, sh.keys.Load(), keys)
		}
	}
	if got := idx.Stats().Entries; got != live {
		t.Fatalf("Stats().Entries = %d, live holders %d", got, live)
	}
	pb := map[PodID]int64{}
	for k := range blocks {
		pb[k.p]++
	}
	for pg := range idx.counts {
		if idx.counts[pg] == nil {
			continue
		}
		for i, c := range idx.counts[pg] {
			p := pg<<podPageBits | i
			if c.entries != entries[PodID(p)] || c.blocks != pb[PodID(p)] {
				t.Fatalf("pod %d: counters %+v, holders say entries %d blocks %d", p, c, entries[PodID(p)], pb[PodID(p)])
			}
		}
	}
}

type collect struct{ got [][]Holder }

func (c *collect) Visit(i int, k Key, hs []Holder) bool {
	c.got = append(c.got, slices.Clone(hs))
	return true
}

// holdersOf returns the live holders of one key, sorted.
func holdersOf(t *testing.T, idx Index, m ModelID, k Key) []Holder {
	t.Helper()
	var c collect
	if err := idx.Lookup(context.Background(), m, []Key{k}, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.got) == 0 {
		return nil
	}
	hs := c.got[0]
	slices.SortFunc(hs, cmpHolder)
	return hs
}

func cmpHolder(a, b Holder) int {
	if a.Pod != b.Pod {
		return int(a.Pod) - int(b.Pod)
	}
	return int(a.Tier) - int(b.Tier)
}

func podBlocks(t *testing.T, idx Index, p PodID) int64 {
	t.Helper()
	n, err := idx.PodBlocks(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMemoryIndexSemantics(t *testing.T) {
	ctx := context.Background()
	gpu := func(p PodID) Holder { return Holder{Pod: p} }
	type step func(t *testing.T, idx *MemoryIndex)
	add := func(m ModelID, p PodID, tier Tier, keys ...Key) step {
		return func(t *testing.T, idx *MemoryIndex) {
			if err := idx.Add(ctx, m, p, tier, keys); err != nil {
				t.Fatal(err)
			}
		}
	}
	rm := func(m ModelID, p PodID, tier Tier, keys ...Key) step {
		return func(t *testing.T, idx *MemoryIndex) {
			if err := idx.Remove(ctx, m, p, tier, keys); err != nil {
				t.Fatal(err)
			}
		}
	}
	clr := func(p PodID) step {
		return func(t *testing.T, idx *MemoryIndex) {
			if err := idx.ClearPod(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	type want struct {
		model   ModelID
		key     Key
		holders []Holder
	}
	cases := []struct {
		name    string
		steps   []step
		want    []want
		blocks  map[PodID]int64
		entries int64
	}{
		{"add", []step{add(0, 1, TierGPU, 10, 11)},
			[]want{{0, 10, []Holder{gpu(1)}}, {0, 11, []Holder{gpu(1)}}, {0, 12, nil}},
			map[PodID]int64{1: 2}, 2},
		{"add is idempotent", []step{add(0, 1, TierGPU, 10), add(0, 1, TierGPU, 10, 10)},
			[]want{{0, 10, []Holder{gpu(1)}}}, map[PodID]int64{1: 1}, 1},
		{"several pods", []step{add(0, 1, TierGPU, 10), add(0, 2, TierGPU, 10), add(0, 3, TierGPU, 10)},
			[]want{{0, 10, []Holder{gpu(1), gpu(2), gpu(3)}}}, map[PodID]int64{1: 1, 2: 1, 3: 1}, 3},
		{"remove", []step{add(0, 1, TierGPU, 10, 11), add(0, 2, TierGPU, 10), rm(0, 1, TierGPU, 10)},
			[]want{{0, 10, []Holder{gpu(2)}}, {0, 11, []Holder{gpu(1)}}}, map[PodID]int64{1: 1, 2: 1}, 2},
		{"remove unknown is a no-op", []step{add(0, 1, TierGPU, 10), rm(0, 1, TierGPU, 99), rm(0, 2, TierGPU, 10), rm(0, 1, TierCPU, 10), rm(1, 1, TierGPU, 10)},
			[]want{{0, 10, []Holder{gpu(1)}}}, map[PodID]int64{1: 1, 2: 0}, 1},
		{"remove twice", []step{add(0, 1, TierGPU, 10), rm(0, 1, TierGPU, 10), rm(0, 1, TierGPU, 10)},
			[]want{{0, 10, nil}}, map[PodID]int64{1: 0}, 0},
		{"tiers are separate holders of one block", []step{add(0, 1, TierGPU, 10), add(0, 1, TierCPU, 10)},
			[]want{{0, 10, []Holder{gpu(1), {Pod: 1, Tier: TierCPU}}}}, map[PodID]int64{1: 1}, 2},
		{"removing one tier keeps the block", []step{add(0, 1, TierGPU, 10), add(0, 1, TierCPU, 10), rm(0, 1, TierGPU, 10)},
			[]want{{0, 10, []Holder{{Pod: 1, Tier: TierCPU}}}}, map[PodID]int64{1: 1}, 1},
		{"models are isolated", []step{add(0, 1, TierGPU, 10), add(1, 2, TierGPU, 10), rm(1, 1, TierGPU, 10)},
			[]want{{0, 10, []Holder{gpu(1)}}, {1, 10, []Holder{gpu(2)}}, {2, 10, nil}}, map[PodID]int64{1: 1, 2: 1}, 2},
		{"clear hides the pod", []step{add(0, 1, TierGPU, 10, 11), add(0, 2, TierGPU, 10), add(0, 1, TierCPU, 12), clr(1)},
			[]want{{0, 10, []Holder{gpu(2)}}, {0, 11, nil}, {0, 12, nil}}, map[PodID]int64{1: 0, 2: 1}, 1},
		{"re-add after clear", []step{add(0, 1, TierGPU, 10, 11), clr(1), add(0, 1, TierGPU, 11, 12)},
			[]want{{0, 10, nil}, {0, 11, []Holder{gpu(1)}}, {0, 12, []Holder{gpu(1)}}}, map[PodID]int64{1: 2}, 2},
		{"remove after clear is a no-op", []step{add(0, 1, TierGPU, 10), clr(1), rm(0, 1, TierGPU, 10)},
			[]want{{0, 10, nil}}, map[PodID]int64{1: 0}, 0},
		{"clear of an unknown pod", []step{clr(7), add(0, 7, TierGPU, 10)},
			[]want{{0, 10, []Holder{gpu(7)}}}, map[PodID]int64{7: 1}, 1},
		{"dp ranks are separate pods", []step{add(0, 4, TierGPU, 10), add(0, 5, TierGPU, 10), clr(4)},
			[]want{{0, 10, []Holder{gpu(5)}}}, map[PodID]int64{4: 0, 5: 1}, 1},
		{"key zero and max key", []step{add(0, 1, TierGPU, 0, ^Key(0))},
			[]want{{0, 0, []Holder{gpu(1)}}, {0, ^Key(0), []Holder{gpu(1)}}}, map[PodID]int64{1: 2}, 2},
		{"high pod id", []step{add(0, MaxPods-1, TierExternal, 10)},
			[]want{{0, 10, []Holder{{Pod: MaxPods - 1, Tier: TierExternal}}}}, map[PodID]int64{MaxPods - 1: 1}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			idx := NewMemoryIndex(MemoryConfig{})
			for _, s := range tc.steps {
				s(t, idx)
			}
			for _, w := range tc.want {
				if got := holdersOf(t, idx, w.model, w.key); !slices.Equal(got, w.holders) {
					t.Errorf("model %d key %d: holders %v, want %v", w.model, w.key, got, w.holders)
				}
			}
			for p, n := range tc.blocks {
				if got := podBlocks(t, idx, p); got != n {
					t.Errorf("PodBlocks(%d) = %d, want %d", p, got, n)
				}
			}
			if got := idx.Stats().Entries; got != tc.entries {
				t.Errorf("Entries = %d, want %d", got, tc.entries)
			}
			checkInvariants(t, idx)
		})
	}
}

func TestMemoryIndexBadInput(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	if err := idx.Add(ctx, 0, 1, NumTiers, []Key{1}); err == nil {
		t.Error("Add with an invalid tier succeeded")
	}
	if err := idx.Remove(ctx, 0, 1, Tier(9), []Key{1}); err == nil {
		t.Error("Remove with an invalid tier succeeded")
	}
	if err := idx.Add(ctx, 0, MaxPods, TierGPU, []Key{1}); err == nil {
		t.Error("Add with a pod id beyond MaxPods succeeded")
	}
	if err := idx.ClearPod(ctx, MaxPods); err == nil {
		t.Error("ClearPod beyond MaxPods succeeded")
	}
	if err := idx.Add(ctx, 0, 1, TierGPU, nil); err != nil {
		t.Errorf("Add of no keys: %v", err)
	}
	if st := idx.Stats(); st.Entries != 0 || st.Keys != 0 {
		t.Errorf("failed calls changed the index: %+v", st)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := idx.Lookup(cctx, 0, []Key{1}, &collect{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Lookup with a cancelled context: %v", err)
	}
}

// stopAfter stops a lookup after n visits.
type stopAfter struct {
	n    int
	seen []int
}

func (s *stopAfter) Visit(i int, k Key, hs []Holder) bool {
	s.seen = append(s.seen, i)
	return len(s.seen) < s.n
}

func TestMemoryIndexLookupStops(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	_ = idx.Add(ctx, 0, 1, TierGPU, []Key{1, 2, 3, 5})
	_ = idx.Add(ctx, 0, 2, TierGPU, []Key{4})
	_ = idx.ClearPod(ctx, 2)
	s := &stopAfter{n: 100}
	_ = idx.Lookup(ctx, 0, []Key{1, 2, 3, 4, 5}, s)
	if !slices.Equal(s.seen, []int{0, 1, 2}) {
		t.Errorf("visited %v, want [0 1 2]: key 4 has only a cleared holder", s.seen)
	}
	s = &stopAfter{n: 2}
	_ = idx.Lookup(ctx, 0, []Key{1, 2, 3}, s)
	if !slices.Equal(s.seen, []int{0, 1}) {
		t.Errorf("visited %v, want [0 1]: the visitor asked to stop", s.seen)
	}
}

func TestMemoryIndexCapacity(t *testing.T) {
	ctx := context.Background()
	keys := func(base, n int) []Key {
		ks := make([]Key, n)
		for i := range ks {
			ks[i] = Key(base + i)
		}
		return ks
	}
	t.Run("evicts and counts", func(t *testing.T) {
		idx := NewMemoryIndex(MemoryConfig{Capacity: 100})
		if err := idx.Add(ctx, 0, 1, TierGPU, keys(0, 150)); err != nil {
			t.Fatal(err)
		}
		st := idx.Stats()
		if st.Entries > 100 || st.Entries < 90 {
			t.Errorf("Entries = %d, want at most 100 (and not far below)", st.Entries)
		}
		if st.Entries+st.Evictions != 150 {
			t.Errorf("Entries %d + Evictions %d != 150 added", st.Entries, st.Evictions)
		}
		if n := podBlocks(t, idx, 1); n != st.Entries {
			t.Errorf("PodBlocks = %d, Entries = %d", n, st.Entries)
		}
		visible := 0
		for _, k := range keys(0, 150) {
			if len(holdersOf(t, idx, 0, k)) > 0 {
				visible++
			}
		}
		if int64(visible) != st.Entries {
			t.Errorf("%d keys visible, Entries = %d", visible, st.Entries)
		}
		checkInvariants(t, idx)
	})
	t.Run("recently stored survive", func(t *testing.T) {
		idx := NewMemoryIndex(MemoryConfig{Capacity: 100})
		_ = idx.Add(ctx, 0, 1, TierGPU, keys(0, 100))
		// a full sweep clears every reference bit and evicts the oldest
		_ = idx.Add(ctx, 0, 1, TierGPU, keys(1000, 10))
		_ = idx.Add(ctx, 0, 1, TierGPU, keys(2000, 10))
		for _, k := range keys(2000, 10) {
			if len(holdersOf(t, idx, 0, k)) == 0 {
				t.Errorf("key %d, just stored, was evicted", k)
			}
		}
		checkInvariants(t, idx)
	})
	t.Run("stale holders are reclaimed, not evicted", func(t *testing.T) {
		idx := NewMemoryIndex(MemoryConfig{Capacity: 100})
		_ = idx.Add(ctx, 0, 1, TierGPU, keys(0, 100))
		_ = idx.ClearPod(ctx, 1)
		_ = idx.Add(ctx, 0, 2, TierGPU, keys(500, 100))
		st := idx.Stats()
		if st.Evictions != 0 || st.Entries != 100 {
			t.Errorf("after clear: %+v, want 100 entries and no evictions", st)
		}
		if n := podBlocks(t, idx, 2); n != 100 {
			t.Errorf("PodBlocks(2) = %d", n)
		}
		checkInvariants(t, idx)
	})
	t.Run("re-adding cleared keys at the bound", func(t *testing.T) {
		idx := NewMemoryIndex(MemoryConfig{Capacity: 100})
		_ = idx.Add(ctx, 0, 1, TierGPU, keys(0, 60))
		_ = idx.Add(ctx, 0, 2, TierGPU, keys(0, 40))
		_ = idx.ClearPod(ctx, 1)
		_ = idx.ClearPod(ctx, 2)
		_ = idx.Add(ctx, 0, 3, TierGPU, keys(0, 100))
		for _, k := range keys(0, 100) {
			if got := holdersOf(t, idx, 0, k); !slices.Equal(got, []Holder{{Pod: 3}}) {
				t.Fatalf("key %d: holders %v", k, got)
			}
		}
		if st := idx.Stats(); st.Entries != 100 || st.Evictions != 0 {
			t.Errorf("stats %+v", st)
		}
		checkInvariants(t, idx)
	})
	t.Run("evicting shared keys", func(t *testing.T) {
		idx := NewMemoryIndex(MemoryConfig{Capacity: 64})
		for p := PodID(0); p < 4; p++ {
			_ = idx.Add(ctx, 0, p, TierGPU, keys(0, 16))
			_ = idx.Add(ctx, 0, p, TierCPU, keys(0, 4))
		}
		_ = idx.Add(ctx, 0, 9, TierGPU, keys(100, 40))
		st := idx.Stats()
		if st.Entries > 64 || st.Entries+st.Evictions != 4*20+40 {
			t.Errorf("stats %+v", st)
		}
		checkInvariants(t, idx)
	})
	t.Run("default capacity", func(t *testing.T) {
		if c := NewMemoryIndex(MemoryConfig{}).Capacity(); c != DefaultMemoryCapacity {
			t.Errorf("Capacity() = %d", c)
		}
	})
}

// TestMemoryIndexLazyReclaim checks that a cleared pod's holders leave memory
// when their keys are written again, not only when evicted.
func TestMemoryIndexLazyReclaim(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	ks := []Key{1, 2, 3}
	_ = idx.Add(ctx, 0, 1, TierGPU, ks)
	_ = idx.Add(ctx, 0, 2, TierGPU, ks)
	_ = idx.ClearPod(ctx, 1)
	_ = idx.Add(ctx, 0, 3, TierGPU, ks)
	used := int64(0)
	for i := range idx.shards {
		used += idx.shards[i].used
	}
	if used != 6 {
		t.Errorf("%d holder words in use, want 6 (pod 1's reclaimed)", used)
	}
	_ = idx.ClearPod(ctx, 2)
	_ = idx.ClearPod(ctx, 3)
	_ = idx.Remove(ctx, 0, 3, TierGPU, ks) // a write: reclaims the stale words
	if st := idx.Stats(); st.Keys != 0 || st.Entries != 0 {
		t.Errorf("after clearing every holder and touching the keys: %+v", st)
	}
	checkInvariants(t, idx)
}

// refIndex is the trivial reference the randomized test compares against.
type refIndex struct {
	holders map[refKey]map[Holder]bool
}

type refKey struct {
	m ModelID
	k Key
}

func (r *refIndex) add(m ModelID, p PodID, tier Tier, ks []Key) {
	for _, k := range ks {
		rk := refKey{m, k}
		if r.holders[rk] == nil {
			r.holders[rk] = map[Holder]bool{}
		}
		r.holders[rk][Holder{p, tier}] = true
	}
}

func (r *refIndex) remove(m ModelID, p PodID, tier Tier, ks []Key) {
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
				tier := Tier(rng.IntN(int(NumTiers)))
				ks := make([]Key, 1+rng.IntN(6))
				for i := range ks {
					ks[i] = Key(rng.IntN(nkeys))
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
					for k := Key(0); k < nkeys; k++ {
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

// TestMemoryIndexConcurrent runs writers (each owning some pods, keeping its
// own reference) and readers (lookups and scores) at once, then checks the
// final state exactly and the index's internal invariants. Under -race it
// also checks that the lock-free read path is free of data races.
func TestMemoryIndexConcurrent(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{Capacity: 1 << 20})
	sc := NewScorer(idx, idx, DefaultTierWeights())
	const writers, podsPerWriter, nkeys = 4, 3, 64
	steps := 3000
	if testing.Short() {
		steps = 500
	}
	refs := make([]*refIndex, writers)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	stop := make(chan struct{})
	for w := 0; w < writers; w++ {
		ref := &refIndex{holders: map[refKey]map[Holder]bool{}}
		refs[w] = ref
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for s := 0; s < steps; s++ {
				p := PodID(w*podsPerWriter + rng.IntN(podsPerWriter))
				tier := Tier(rng.IntN(2))
				start := rng.IntN(nkeys)
				ks := make([]Key, 1+rng.IntN(8))
				for i := range ks {
					ks[i] = Key((start + i) % nkeys)
				}
				var err error
				switch r := rng.IntN(20); {
				case r < 12:
					err = idx.Add(ctx, 0, p, tier, ks)
					ref.add(0, p, tier, ks)
				case r < 19:
					err = idx.Remove(ctx, 0, p, tier, ks)
					ref.remove(0, p, tier, ks)
				default:
					err = idx.ClearPod(ctx, p)
					ref.clear(p)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	var rwg sync.WaitGroup
	for r := 0; r < 2; r++ {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			keys := make([]Key, nkeys)
			for i := range keys {
				keys[i] = Key(i)
			}
			var res ScoreResult
			var c collect
			for {
				select {
				case <-stop:
					return
				default:
				}
				c.got = c.got[:0]
				if err := idx.Lookup(ctx, 0, keys, &c); err != nil {
					errs <- err
					return
				}
				for _, hs := range c.got {
					seen := map[Holder]bool{}
					for _, h := range hs {
						if seen[h] || h.Tier >= 2 || h.Pod >= writers*podsPerWriter {
							errs <- fmt.Errorf("impossible holder set %v", hs)
							return
						}
						seen[h] = true
					}
				}
				if err := sc.Score(ctx, 0, keys, nil, &res); err != nil {
					errs <- err
					return
				}
				for _, ps := range res.Pods {
					if ps.MatchedBlocks > nkeys || ps.MatchedBlocks <= 0 {
						errs <- fmt.Errorf("impossible score %+v", ps)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rwg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var total int64
	for k := Key(0); k < nkeys; k++ {
		var want []Holder
		for _, ref := range refs {
			for h := range ref.holders[refKey{0, k}] {
				want = append(want, h)
			}
		}
		slices.SortFunc(want, cmpHolder)
		total += int64(len(want))
		if got := holdersOf(t, idx, 0, k); !slices.Equal(got, want) {
			t.Errorf("key %d: holders %v, want %v", k, got, want)
		}
	}
	for w, ref := range refs {
		for i := 0; i < podsPerWriter; i++ {
			p := PodID(w*podsPerWriter + i)
			if got, want := podBlocks(t, idx, p), ref.podBlocks(p); got != want {
				t.Errorf("PodBlocks(%d) = %d, want %d", p, got, want)
			}
		}
	}
	if got := idx.Stats().Entries; got != total {
		t.Errorf("Entries = %d, want %d", got, total)
	}
	checkInvariants(t, idx)
}

// TestMemoryIndexConcurrentEviction stresses the eviction sweep against
// concurrent writers, clears and readers; it checks invariants, not timing.
func TestMemoryIndexConcurrentEviction(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{Capacity: 200})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			ks := make([]Key, 16)
			var c collect
			for s := 0; s < 400; s++ {
				for i := range ks {
					ks[i] = Key(rng.IntN(500))
				}
				p := PodID(rng.IntN(6))
				switch rng.IntN(10) {
				case 0:
					_ = idx.ClearPod(ctx, p)
				case 1, 2:
					_ = idx.Remove(ctx, 0, p, TierGPU, ks)
				case 3:
					c.got = c.got[:0]
					_ = idx.Lookup(ctx, 0, ks, &c)
				default:
					if err := idx.Add(ctx, 0, p, Tier(rng.IntN(2)), ks); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	st := idx.Stats()
	if st.Entries > 200 || st.Evictions == 0 {
		t.Errorf("stats %+v: want at most 200 entries and some evictions", st)
	}
	checkInvariants(t, idx)
}
