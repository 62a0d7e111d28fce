package kvindex

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
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

func (c *collect) Visit(i int, k blockkeys.Key, hs []Holder) bool {
	c.got = append(c.got, slices.Clone(hs))
	return true
}

// holdersOf returns the live holders of one key, sorted.
func holdersOf(t *testing.T, idx Index, m ModelID, k blockkeys.Key) []Holder {
	t.Helper()
	var c collect
	if err := idx.Lookup(context.Background(), m, []blockkeys.Key{k}, &c); err != nil {
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
	add := func(m ModelID, p PodID, tier event.Tier, keys ...blockkeys.Key) step {
		return func(t *testing.T, idx *MemoryIndex) {
			if err := idx.Add(ctx, m, p, tier, keys); err != nil {
				t.Fatal(err)
			}
		}
	}
	rm := func(m ModelID, p PodID, tier event.Tier, keys ...blockkeys.Key) step {
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
		key     blockkeys.Key
		holders []Holder
	}
	cases := []struct {
		name    string
		steps   []step
		want    []want
		blocks  map[PodID]int64
		entries int64
	}{
		{"add", []step{add(0, 1, event.TierGPU, 10, 11)},
			[]want{{0, 10, []Holder{gpu(1)}}, {0, 11, []Holder{gpu(1)}}, {0, 12, nil}},
			map[PodID]int64{1: 2}, 2},
		{"add is idempotent", []step{add(0, 1, event.TierGPU, 10), add(0, 1, event.TierGPU, 10, 10)},
			[]want{{0, 10, []Holder{gpu(1)}}}, map[PodID]int64{1: 1}, 1},
		{"several pods", []step{add(0, 1, event.TierGPU, 10), add(0, 2, event.TierGPU, 10), add(0, 3, event.TierGPU, 10)},
			[]want{{0, 10, []Holder{gpu(1), gpu(2), gpu(3)}}}, map[PodID]int64{1: 1, 2: 1, 3: 1}, 3},
		{"remove", []step{add(0, 1, event.TierGPU, 10, 11), add(0, 2, event.TierGPU, 10), rm(0, 1, event.TierGPU, 10)},
			[]want{{0, 10, []Holder{gpu(2)}}, {0, 11, []Holder{gpu(1)}}}, map[PodID]int64{1: 1, 2: 1}, 2},
		{"remove unknown is a no-op", []step{add(0, 1, event.TierGPU, 10), rm(0, 1, event.TierGPU, 99), rm(0, 2, event.TierGPU, 10), rm(0, 1, event.TierCPU, 10), rm(1, 1, event.TierGPU, 10)},
			[]want{{0, 10, []Holder{gpu(1)}}}, map[PodID]int64{1: 1, 2: 0}, 1},
		{"remove twice", []step{add(0, 1, event.TierGPU, 10), rm(0, 1, event.TierGPU, 10), rm(0, 1, event.TierGPU, 10)},
			[]want{{0, 10, nil}}, map[PodID]int64{1: 0}, 0},
		{"tiers are separate holders of one block", []step{add(0, 1, event.TierGPU, 10), add(0, 1, event.TierCPU, 10)},
			[]want{{0, 10, []Holder{gpu(1), {Pod: 1, Tier: event.TierCPU}}}}, map[PodID]int64{1: 1}, 2},
		{"removing one tier keeps the block", []step{add(0, 1, event.TierGPU, 10), add(0, 1, event.TierCPU, 10), rm(0, 1, event.TierGPU, 10)},
			[]want{{0, 10, []Holder{{Pod: 1, Tier: event.TierCPU}}}}, map[PodID]int64{1: 1}, 1},
		{"models are isolated", []step{add(0, 1, event.TierGPU, 10), add(1, 2, event.TierGPU, 10), rm(1, 1, event.TierGPU, 10)},
			[]want{{0, 10, []Holder{gpu(1)}}, {1, 10, []Holder{gpu(2)}}, {2, 10, nil}}, map[PodID]int64{1: 1, 2: 1}, 2},
		{"clear hides the pod", []step{add(0, 1, event.TierGPU, 10, 11), add(0, 2, event.TierGPU, 10), add(0, 1, event.TierCPU, 12), clr(1)},
			[]want{{0, 10, []Holder{gpu(2)}}, {0, 11, nil}, {0, 12, nil}}, map[PodID]int64{1: 0, 2: 1}, 1},
		{"re-add after clear", []step{add(0, 1, event.TierGPU, 10, 11), clr(1), add(0, 1, event.TierGPU, 11, 12)},
			[]want{{0, 10, nil}, {0, 11, []Holder{gpu(1)}}, {0, 12, []Holder{gpu(1)}}}, map[PodID]int64{1: 2}, 2},
		{"remove after clear is a no-op", []step{add(0, 1, event.TierGPU, 10), clr(1), rm(0, 1, event.TierGPU, 10)},
			[]want{{0, 10, nil}}, map[PodID]int64{1: 0}, 0},
		{"clear of an unknown pod", []step{clr(7), add(0, 7, event.TierGPU, 10)},
			[]want{{0, 10, []Holder{gpu(7)}}}, map[PodID]int64{7: 1}, 1},
		{"dp ranks are separate pods", []step{add(0, 4, event.TierGPU, 10), add(0, 5, event.TierGPU, 10), clr(4)},
			[]want{{0, 10, []Holder{gpu(5)}}}, map[PodID]int64{4: 0, 5: 1}, 1},
		{"key zero and max key", []step{add(0, 1, event.TierGPU, 0, ^blockkeys.Key(0))},
			[]want{{0, 0, []Holder{gpu(1)}}, {0, ^blockkeys.Key(0), []Holder{gpu(1)}}}, map[PodID]int64{1: 2}, 2},
		{"high pod id", []step{add(0, MaxPods-1, event.TierExternal, 10)},
			[]want{{0, 10, []Holder{{Pod: MaxPods - 1, Tier: event.TierExternal}}}}, map[PodID]int64{MaxPods - 1: 1}, 1},
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
	if err := idx.Add(ctx, 0, 1, event.NumTiers, []blockkeys.Key{1}); err == nil {
		t.Error("Add with an invalid tier succeeded")
	}
	// the shared tier is credited at query time, never stored: its 2-bit
	// packing would otherwise read back as GPU
	if err := idx.Add(ctx, 0, 1, event.TierShared, []blockkeys.Key{1}); err == nil {
		t.Error("Add on the shared tier succeeded")
	}
	if err := idx.Remove(ctx, 0, 1, event.Tier(9), []blockkeys.Key{1}); err == nil {
		t.Error("Remove with an invalid tier succeeded")
	}
	if err := idx.Add(ctx, 0, MaxPods, event.TierGPU, []blockkeys.Key{1}); err == nil {
		t.Error("Add with a pod id beyond MaxPods succeeded")
	}
	if err := idx.ClearPod(ctx, MaxPods); err == nil {
		t.Error("ClearPod beyond MaxPods succeeded")
	}
	if err := idx.Add(ctx, 0, 1, event.TierGPU, nil); err != nil {
		t.Errorf("Add of no keys: %v", err)
	}
	if st := idx.Stats(); st.Entries != 0 || st.Keys != 0 {
		t.Errorf("failed calls changed the index: %+v", st)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := idx.Lookup(cctx, 0, []blockkeys.Key{1}, &collect{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Lookup with a cancelled context: %v", err)
	}
}

// stopAfter stops a lookup after n visits.
type stopAfter struct {
	n    int
	seen []int
}

func (s *stopAfter) Visit(i int, k blockkeys.Key, hs []Holder) bool {
	s.seen = append(s.seen, i)
	return len(s.seen) < s.n
}

func TestMemoryIndexLookupStops(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	_ = idx.Add(ctx, 0, 1, event.TierGPU, []blockkeys.Key{1, 2, 3, 5})
	_ = idx.Add(ctx, 0, 2, event.TierGPU, []blockkeys.Key{4})
	_ = idx.ClearPod(ctx, 2)
	s := &stopAfter{n: 100}
	_ = idx.Lookup(ctx, 0, []blockkeys.Key{1, 2, 3, 4, 5}, s)
	if !slices.Equal(s.seen, []int{0, 1, 2}) {
		t.Errorf("visited %v, want [0 1 2]: key 4 has only a cleared holder", s.seen)
	}
	s = &stopAfter{n: 2}
	_ = idx.Lookup(ctx, 0, []blockkeys.Key{1, 2, 3}, s)
	if !slices.Equal(s.seen, []int{0, 1}) {
		t.Errorf("visited %v, want [0 1]: the visitor asked to stop", s.seen)
	}
}

// AddHeld reports which keys the pod already held on the tier: not another
// pod's, not another tier's, not a cleared pod's (stale holders), and a key
// given twice in one call is held the second time. The applier counts a
// block's extra copies from this answer (applier/holding.go).
func TestMemoryIndexAddHeld(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	const a, b PodID = 1, 2
	add := func(pod PodID, tier event.Tier, keys ...blockkeys.Key) []bool {
		t.Helper()
		held := make([]bool, len(keys)+1) // longer than keys is fine
		held[len(keys)] = true            // and left alone
		if err := idx.AddHeld(ctx, 0, pod, tier, keys, held); err != nil {
			t.Fatal(err)
		}
		if !held[len(keys)] {
			t.Fatal("AddHeld wrote past len(keys)")
		}
		return held[:len(keys)]
	}
	if got := add(a, event.TierGPU, 1, 2, 3); !slices.Equal(got, []bool{false, false, false}) {
		t.Fatalf("first add: %v", got)
	}
	if got := add(b, event.TierGPU, 1, 4); !slices.Equal(got, []bool{false, false}) {
		t.Fatalf("another pod's keys reported held: %v", got)
	}
	if got := add(a, event.TierCPU, 1); !slices.Equal(got, []bool{false}) {
		t.Fatalf("another tier's key reported held: %v", got)
	}
	if got := add(a, event.TierGPU, 3, 4, 1, 4); !slices.Equal(got, []bool{true, false, true, true}) {
		t.Fatalf("held %v, want [true false true true]", got)
	}
	if n, _ := idx.PodBlocks(ctx, a); n != 4 { // blocks 1-4 (1 on two tiers)
		t.Fatalf("pod a holds %d blocks, want 4", n)
	}
	if err := idx.ClearPod(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got := add(a, event.TierGPU, 1, 2); !slices.Equal(got, []bool{false, false}) {
		t.Fatalf("a cleared pod's keys reported held: %v", got)
	}
	// Add is AddHeld without the report.
	if err := idx.Add(ctx, 0, a, event.TierGPU, []blockkeys.Key{2, 5}); err != nil {
		t.Fatal(err)
	}
	if got := add(a, event.TierGPU, 5); !slices.Equal(got, []bool{true}) {
		t.Fatalf("a key added by Add: %v", got)
	}
	// A call longer than one write group (touchGroup): each answer lands on
	// its own key, across the groups' boundaries.
	var long, thirds []blockkeys.Key
	var want []bool
	for k := blockkeys.Key(100); k < 100+3*writeGroup+5; k++ {
		long = append(long, k)
		want = append(want, k%3 == 0)
		if k%3 == 0 {
			thirds = append(thirds, k)
		}
	}
	add(a, event.TierGPU, thirds...)
	if got := add(a, event.TierGPU, long...); !slices.Equal(got, want) {
		t.Fatalf("long call: held %v, want %v", got, want)
	}
	if err := idx.AddHeld(ctx, 0, a, event.TierGPU, []blockkeys.Key{6, 7}, make([]bool, 1)); err == nil {
		t.Fatal("AddHeld with fewer held slots than keys succeeded")
	}
	checkInvariants(t, idx)
}
