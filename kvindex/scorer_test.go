package kvindex

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/internal/testkit/race"
	"github.com/kvindex/kvindex/kvevents/event"
)

// visitorOnly hides MemoryIndex's concrete type so the scorer takes the
// generic Visitor path (the one the Redis backend uses).
type visitorOnly struct{ Index }

// TestScorerUsesPrefixScorer: an index that scores prefixes itself is asked
// to, and one that does not is walked through Lookup.
func TestScorerUsesPrefixScorer(t *testing.T) {
	idx := NewMemoryIndex(MemoryConfig{})
	if NewScorer(idx, idx, DefaultTierWeights()).prefix == nil {
		t.Error("MemoryIndex is not used as a PrefixScorer")
	}
	if NewScorer(visitorOnly{idx}, nil, DefaultTierWeights()).prefix != nil {
		t.Error("an index without ScorePrefix got the fused path")
	}
}

func TestDefaultTierWeights(t *testing.T) {
	w := DefaultTierWeights()
	if w != (TierWeights{1.0, 0.8, 0.5, 0.3, 0.4}) {
		t.Errorf("DefaultTierWeights() = %v", w)
	}
}

func TestScorerSemantics(t *testing.T) {
	ctx := context.Background()
	type hold struct {
		pod  PodID
		tier event.Tier
		keys []blockkeys.Key
	}
	ks := func(k ...blockkeys.Key) []blockkeys.Key { return k }
	gpu := func(n int32) [event.NumTiers]int32 { return [event.NumTiers]int32{n, 0, 0, 0} }
	cases := []struct {
		name       string
		holds      []hold
		clear      []PodID
		query      []blockkeys.Key
		candidates []PodID
		want       []PodScore
	}{
		{name: "longest prefix per pod",
			holds: []hold{{1, event.TierGPU, ks(1, 2, 3)}, {2, event.TierGPU, ks(1, 2)}, {3, event.TierGPU, ks(1)}},
			query: ks(1, 2, 3, 4),
			want:  []PodScore{{1, 3, 3, gpu(3), gpu(3)}, {2, 2, 2, gpu(2), gpu(2)}, {3, 1, 1, gpu(1), gpu(1)}}},
		{name: "a gap ends the run",
			holds: []hold{{1, event.TierGPU, ks(1, 3, 4)}, {2, event.TierGPU, ks(1, 2)}},
			query: ks(1, 2, 3, 4),
			want:  []PodScore{{2, 2, 2, gpu(2), gpu(2)}, {1, 1, 1, gpu(1), gpu(1)}}},
		{name: "pod 0 leaving a shared holder set ends its run",
			// holder word 0 (pod 0, epoch 0, GPU) once added nothing
			// to a chunk's signature, so {0,1,3} and {1,3} looked the same
			holds: []hold{{0, event.TierGPU, ks(1)}, {1, event.TierGPU, ks(1, 2)}, {3, event.TierGPU, ks(1, 2)}},
			query: ks(1, 2),
			want:  []PodScore{{1, 2, 2, gpu(2), gpu(2)}, {3, 2, 2, gpu(2), gpu(2)}, {0, 1, 1, gpu(1), gpu(1)}}},
		{name: "no block 0 means no match",
			holds: []hold{{1, event.TierGPU, ks(2, 3)}},
			query: ks(1, 2, 3),
			want:  nil},
		{name: "tier weights",
			holds: []hold{{1, event.TierCPU, ks(1, 2)}, {2, event.TierDisk, ks(1, 2)}, {3, event.TierExternal, ks(1, 2)}, {4, event.TierGPU, ks(1)}},
			query: ks(1, 2),
			want: []PodScore{{1, 2, 1.6, [event.NumTiers]int32{0, 2, 0, 0}, [event.NumTiers]int32{0, 2, 0, 0}}, {2, 2, 1.0, [event.NumTiers]int32{0, 0, 2, 0}, [event.NumTiers]int32{0, 0, 2, 0}},
				{4, 1, 1.0, gpu(1), gpu(1)}, {3, 2, 0.6, [event.NumTiers]int32{0, 0, 0, 2}, [event.NumTiers]int32{0, 0, 0, 2}}}},
		{name: "a block on several tiers counts once with the best",
			holds: []hold{{1, event.TierCPU, ks(1, 2, 3)}, {1, event.TierGPU, ks(2)}, {1, event.TierDisk, ks(3)}},
			query: ks(1, 2, 3),
			// per-tier runs: CPU holds all three, GPU misses block 0
			want: []PodScore{{1, 3, 0.8 + 1.0 + 0.8, [event.NumTiers]int32{1, 2, 0, 0}, [event.NumTiers]int32{0, 3, 0, 0}}}},
		{name: "mixed tiers continue the run",
			holds: []hold{{1, event.TierGPU, ks(1)}, {1, event.TierCPU, ks(2)}, {1, event.TierDisk, ks(3)}},
			query: ks(1, 2, 3),
			// per-tier runs: only GPU holds block 0
			want: []PodScore{{1, 3, 2.3, [event.NumTiers]int32{1, 1, 1, 0}, [event.NumTiers]int32{1, 0, 0, 0}}}},
		{name: "tier runs count a block on two tiers in both",
			// offloaded to CPU as it was written: GPU holds 4, CPU all 6
			holds: []hold{{1, event.TierGPU, ks(1, 2, 3, 4)}, {1, event.TierCPU, ks(1, 2, 3, 4, 5, 6)}},
			query: ks(1, 2, 3, 4, 5, 6),
			want:  []PodScore{{1, 6, 4 + 2*0.8, [event.NumTiers]int32{4, 2, 0, 0}, [event.NumTiers]int32{4, 6, 0, 0}}}},
		{name: "a CPU-only tail counts in no tier run",
			holds: []hold{{1, event.TierGPU, ks(1, 2, 3, 4)}, {1, event.TierCPU, ks(3, 4, 5, 6)}, {2, event.TierCPU, ks(1, 2)}, {2, event.TierGPU, ks(2)}},
			query: ks(1, 2, 3, 4, 5, 6, 7),
			want: []PodScore{{1, 6, 4 + 2*0.8, [event.NumTiers]int32{4, 2, 0, 0}, [event.NumTiers]int32{4, 0, 0, 0}},
				{2, 2, 1.8, [event.NumTiers]int32{1, 1, 0, 0}, [event.NumTiers]int32{0, 2, 0, 0}}}},
		{name: "candidate filter",
			holds:      []hold{{1, event.TierGPU, ks(1, 2, 3)}, {2, event.TierGPU, ks(1, 2)}, {3, event.TierGPU, ks(1)}},
			query:      ks(1, 2, 3),
			candidates: []PodID{3, 2, 2, 9},
			want:       []PodScore{{2, 2, 2, gpu(2), gpu(2)}, {3, 1, 1, gpu(1), gpu(1)}}},
		{name: "empty candidate list matches nothing",
			holds:      []hold{{1, event.TierGPU, ks(1)}},
			query:      ks(1),
			candidates: []PodID{},
			want:       nil},
		{name: "dp ranks are separate pods",
			holds: []hold{{10, event.TierGPU, ks(1, 2, 3)}, {11, event.TierGPU, ks(1)}},
			query: ks(1, 2, 3),
			want:  []PodScore{{10, 3, 3, gpu(3), gpu(3)}, {11, 1, 1, gpu(1), gpu(1)}}},
		{name: "cleared pods do not score",
			holds: []hold{{1, event.TierGPU, ks(1, 2)}, {2, event.TierGPU, ks(1)}},
			clear: []PodID{1},
			query: ks(1, 2),
			want:  []PodScore{{2, 1, 1, gpu(1), gpu(1)}}},
		{name: "ties: more blocks first, then pod id",
			holds: []hold{{5, event.TierGPU, ks(1)}, {4, event.TierGPU, ks(1)}, {3, event.TierDisk, ks(1, 2)}},
			query: ks(1, 2, 3),
			want:  []PodScore{{3, 2, 1, [event.NumTiers]int32{0, 0, 2, 0}, [event.NumTiers]int32{0, 0, 2, 0}}, {4, 1, 1, gpu(1), gpu(1)}, {5, 1, 1, gpu(1), gpu(1)}}},
		{name: "empty query",
			holds: []hold{{1, event.TierGPU, ks(1)}},
			query: nil,
			want:  nil},
	}
	for _, tc := range cases {
		for _, generic := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/generic=%v", tc.name, generic), func(t *testing.T) {
				idx := NewMemoryIndex(MemoryConfig{})
				for _, h := range tc.holds {
					if err := idx.Add(ctx, 0, h.pod, h.tier, h.keys); err != nil {
						t.Fatal(err)
					}
				}
				for _, p := range tc.clear {
					_ = idx.ClearPod(ctx, p)
				}
				var s *Scorer
				if generic {
					s = NewScorer(visitorOnly{idx}, nil, DefaultTierWeights())
				} else {
					s = NewScorer(idx, idx, DefaultTierWeights())
				}
				var res ScoreResult
				if err := s.Score(ctx, 0, tc.query, tc.candidates, &res); err != nil {
					t.Fatal(err)
				}
				if res.TotalBlocks != len(tc.query) {
					t.Errorf("TotalBlocks = %d, want %d", res.TotalBlocks, len(tc.query))
				}
				if !samePodScores(res.Pods, tc.want) {
					t.Errorf("got  %v\nwant %v", res.Pods, tc.want)
				}
			})
		}
	}
}

func samePodScores(a, b []PodScore) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		d := x.Score - y.Score
		if x.Pod != y.Pod || x.MatchedBlocks != y.MatchedBlocks || x.TierBlocks != y.TierBlocks || x.TierRuns != y.TierRuns || d > 1e-9 || d < -1e-9 {
			return false
		}
	}
	return true
}

// countingIndex records how many keys a lookup visits.
type countingIndex struct {
	Index
	visited int
}

type countingVisitor struct {
	v Visitor
	c *countingIndex
}

func (cv countingVisitor) Visit(i int, k blockkeys.Key, hs []Holder) bool {
	cv.c.visited++
	return cv.v.Visit(i, k, hs)
}

func (c *countingIndex) Lookup(ctx context.Context, m ModelID, keys []blockkeys.Key, v Visitor) error {
	return c.Index.Lookup(ctx, m, keys, countingVisitor{v, c})
}

// TestScorerStopsEarly: the walk ends when no candidate can extend its run,
// not at the end of the request.
func TestScorerStopsEarly(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	keys := make([]blockkeys.Key, 100)
	for i := range keys {
		keys[i] = blockkeys.Key(i + 1)
	}
	_ = idx.Add(ctx, 0, 1, event.TierGPU, keys[:5])
	_ = idx.Add(ctx, 0, 2, event.TierGPU, keys)
	ci := &countingIndex{Index: idx}
	s := NewScorer(ci, nil, DefaultTierWeights())
	var res ScoreResult
	_ = s.Score(ctx, 0, keys, []PodID{1}, &res)
	if ci.visited != 6 {
		t.Errorf("visited %d keys for a candidate holding 5, want 6 (the 6th ends the run)", ci.visited)
	}
	if len(res.Pods) != 1 || res.Pods[0].MatchedBlocks != 5 {
		t.Errorf("result %v", res.Pods)
	}
	ci.visited = 0
	_ = s.Score(ctx, 0, keys, []PodID{3}, &res)
	if ci.visited != 1 || len(res.Pods) != 0 {
		t.Errorf("candidate holding nothing: visited %d, result %v", ci.visited, res.Pods)
	}
}

// TestScorerReusesResult: a warm Score allocates nothing, on both paths.
func TestScorerReusesResult(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	keys := make([]blockkeys.Key, 64)
	for i := range keys {
		keys[i] = blockkeys.Key(i)
	}
	for p := PodID(0); p < 16; p++ {
		_ = idx.Add(ctx, 0, p, event.TierGPU, keys[:4*(p+1)])
	}
	for _, s := range []*Scorer{NewScorer(idx, idx, DefaultTierWeights()), NewScorer(visitorOnly{idx}, nil, DefaultTierWeights())} {
		var res ScoreResult
		_ = s.Score(ctx, 0, keys, nil, &res)
		cands := []PodID{1, 2, 3}
		allocs := testing.AllocsPerRun(50, func() {
			_ = s.Score(ctx, 0, keys, nil, &res)
			_ = s.Score(ctx, 0, keys, cands, &res)
		})
		if allocs != 0 && !race.Enabled {
			t.Errorf("warm Score allocates %.1f times per call", allocs)
		}
	}
}

// TestScorerMatchesReference compares both scorer paths with a direct
// computation over the reference index on random fleets, including runs
// where holder sets repeat (the fast path's skipping) and pods are cleared.
func TestScorerMatchesReference(t *testing.T) {
	ctx := context.Background()
	w := DefaultTierWeights()
	nonEmpty := 0
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		idx := NewMemoryIndex(MemoryConfig{})
		ref := &refIndex{holders: map[refKey]map[Holder]bool{}}
		const nkeys = 48
		keys := make([]blockkeys.Key, nkeys)
		for i := range keys {
			keys[i] = blockkeys.Key(1000 + i)
		}
		npods := 1 + rng.IntN(10)
		for p := PodID(0); p < PodID(npods); p++ {
			for r := rng.IntN(4); r >= 0; r-- {
				tier := event.Tier(rng.IntN(int(event.NumStoredTiers)))
				lo := 0
				if rng.IntN(3) == 0 {
					lo = rng.IntN(nkeys)
				}
				hi := lo + rng.IntN(nkeys-lo+1)
				_ = idx.Add(ctx, 0, p, tier, keys[lo:hi])
				ref.add(0, p, tier, keys[lo:hi])
			}
			if rng.IntN(5) == 0 {
				k := keys[rng.IntN(nkeys)]
				_ = idx.Remove(ctx, 0, p, event.TierGPU, []blockkeys.Key{k})
				ref.remove(0, p, event.TierGPU, []blockkeys.Key{k})
			}
			if rng.IntN(8) == 0 {
				_ = idx.ClearPod(ctx, p)
				ref.clear(p)
			}
		}
		var cands []PodID
		if rng.IntN(2) == 0 {
			for p := PodID(0); p < PodID(npods+2); p++ {
				if rng.IntN(2) == 0 {
					cands = append(cands, p)
				}
			}
			if cands == nil {
				cands = []PodID{}
			}
		}
		// reference: walk each pod's run directly
		var want []PodScore
		for p := PodID(0); p < PodID(npods); p++ {
			if cands != nil && !slices.Contains(cands, p) {
				continue
			}
			ps := PodScore{Pod: p}
			for _, k := range keys {
				best := event.Tier(event.NumTiers)
				for h := range ref.holders[refKey{0, k}] {
					if h.Pod == p && (best == event.NumTiers || w[h.Tier] > w[best]) {
						best = h.Tier
					}
				}
				if best == event.NumTiers {
					break
				}
				ps.MatchedBlocks++
				ps.TierBlocks[best]++
			}
			for ti, n := range ps.TierBlocks {
				ps.Score += float64(n) * w[ti]
			}
			ps.TierRuns = refTierRuns(ref, 0, keys, p)
			if ps.MatchedBlocks > 0 {
				want = append(want, ps)
			}
		}
		slices.SortFunc(want, ComparePodScores)
		if len(want) > 0 {
			nonEmpty++
		}
		for _, s := range []*Scorer{NewScorer(idx, idx, w), NewScorer(visitorOnly{idx}, nil, w)} {
			var res ScoreResult
			if err := s.Score(ctx, 0, keys, cands, &res); err != nil {
				t.Fatal(err)
			}
			if !samePodScores(res.Pods, want) {
				t.Fatalf("seed %d (candidates %v):\n got  %v\n want %v", seed, cands, res.Pods, want)
			}
		}
	}
	if nonEmpty < 15 { // equal empty results would prove nothing
		t.Fatalf("only %d of 30 fleets had a non-empty expected score", nonEmpty)
	}
}

func TestInterner(t *testing.T) {
	in := NewInterner()
	a := in.Pod("pod-a", 0)
	b := in.Pod("pod-b", 0)
	a1 := in.Pod("pod-a", 1)
	if a != 0 || b != 1 || a1 != 2 || in.Pod("pod-a", 0) != a {
		t.Fatalf("ids not dense and stable: %d %d %d", a, b, a1)
	}
	if id, ok := in.LookupPod("pod-a", 1); !ok || id != a1 {
		t.Errorf("LookupPod = %d %v", id, ok)
	}
	if _, ok := in.LookupPod("pod-c", 0); ok {
		t.Error("LookupPod interned a new pod")
	}
	if n, r := in.PodName(a1); n != "pod-a" || r != 1 {
		t.Errorf("PodName = %q %d", n, r)
	}
	if n, _ := in.PodName(99); n != "" {
		t.Errorf("PodName(unknown) = %q", n)
	}
	if got := in.PodsNamed("pod-a"); !slices.Equal(got, []PodID{a, a1}) {
		t.Errorf("PodsNamed = %v", got)
	}
	if in.PodsNamed("nope") != nil || in.NumPods() != 3 {
		t.Error("PodsNamed(unknown) or NumPods wrong")
	}
	m := in.Model("llama")
	if m != 0 || in.Model("qwen") != 1 || in.Model("llama") != 0 {
		t.Error("model ids not dense and stable")
	}
	if id, ok := in.LookupModel("qwen"); !ok || id != 1 || in.ModelName(1) != "qwen" || in.ModelName(7) != "" {
		t.Error("model lookups wrong")
	}
	if _, ok := in.LookupModel("x"); ok {
		t.Error("LookupModel interned")
	}
}

func TestInternerConcurrent(t *testing.T) {
	in := NewInterner()
	done := make(chan []PodID)
	for g := 0; g < 4; g++ {
		go func() {
			ids := make([]PodID, 50)
			for i := range ids {
				ids[i] = in.Pod(fmt.Sprint("pod", i), i%2)
				_ = in.Model(fmt.Sprint("m", i%3))
			}
			done <- ids
		}()
	}
	first := <-done
	for g := 1; g < 4; g++ {
		if got := <-done; !slices.Equal(got, first) {
			t.Fatal("goroutines got different ids for the same pods")
		}
	}
	if in.NumPods() != 50 {
		t.Errorf("NumPods = %d, want 50", in.NumPods())
	}
	seen := map[PodID]bool{}
	for _, id := range first {
		if id >= 50 || seen[id] {
			t.Fatalf("ids not dense: %v", first)
		}
		seen[id] = true
	}
}

func TestScorerEdges(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	_ = idx.Add(ctx, 0, 1, event.TierGPU, []blockkeys.Key{1, 2})
	_ = idx.Add(ctx, 0, 1, event.TierCPU, []blockkeys.Key{1})
	if n := idx.PodEntries(1); n != 3 {
		t.Errorf("PodEntries = %d, want 3 (a block on two tiers is two entries)", n)
	}
	if n := podBlocks(t, idx, 1); n != 2 {
		t.Errorf("PodBlocks = %d, want 2 (a block on two tiers is one block)", n)
	}
	w := TierWeights{0.1, 0.2, 0.3, 0.4}
	for _, s := range []*Scorer{NewScorer(idx, idx, w), NewScorer(visitorOnly{idx}, nil, w)} {
		if s.Weights() != w {
			t.Errorf("Weights() = %v", s.Weights())
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		var res ScoreResult
		if err := s.Score(cctx, 0, []blockkeys.Key{1, 2}, nil, &res); err == nil {
			t.Error("Score with a cancelled context succeeded")
		}
		// a stray id (never interned) is ignored, not used to size state
		if err := s.Score(ctx, 0, []blockkeys.Key{1, 2}, []PodID{MaxPods + 5, 1}, &res); err != nil || len(res.Pods) != 1 {
			t.Errorf("Score with a stray candidate: %v %v", err, res.Pods)
		}
		// custom weights: the CPU copy of block 0 is worth more here
		if !samePodScores(res.Pods, []PodScore{{1, 2, 0.2 + 0.1, [event.NumTiers]int32{1, 1, 0, 0}, [event.NumTiers]int32{2, 1, 0, 0}}}) {
			t.Errorf("custom weights: %v", res.Pods)
		}
	}
}
