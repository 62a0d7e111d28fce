package kvindex

import (
	"context"
	"runtime"
	"testing"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
)

// scriptedIndex hands fixed holder lists to the generic scoring path, as a
// backend whose lists come in any order (or hold a tier this build does not
// know) would.
type scriptedIndex struct {
	Index
	blocks [][]Holder
}

func (s scriptedIndex) Lookup(_ context.Context, _ ModelID, keys []blockkeys.Key, v Visitor) error {
	for i := range keys {
		if i >= len(s.blocks) || !v.Visit(i, keys[i], s.blocks[i]) {
			return nil
		}
	}
	return nil
}

// With equal tier weights the generic path keeps crediting the tier it
// first saw for a block (as the fused path, whose holders are sorted by
// tier, does); a holder with an out-of-range tier is ignored, not scored.
func TestScorerGenericTiesAndBadTiers(t *testing.T) {
	ctx := context.Background()
	w := TierWeights{event.TierGPU: 1, event.TierCPU: 0.5, event.TierDisk: 0.5, event.TierExternal: 0.5}
	idx := scriptedIndex{blocks: [][]Holder{
		{{Pod: 1, Tier: event.TierCPU}, {Pod: 1, Tier: event.TierDisk}, {Pod: 2, Tier: 7}, {Pod: 3, Tier: event.NumTiers}},
		{{Pod: 1, Tier: event.TierCPU}, {Pod: 1, Tier: event.TierExternal}, {Pod: 2, Tier: event.TierGPU}},
		{{Pod: 1, Tier: event.TierDisk}, {Pod: 1, Tier: event.TierCPU}},
	}}
	s := NewScorer(idx, nil, w)
	var res ScoreResult
	if err := s.Score(ctx, 0, []blockkeys.Key{1, 2, 3}, nil, &res); err != nil {
		t.Fatal(err)
	}
	want := []PodScore{{Pod: 1, MatchedBlocks: 3, Score: 1.5, TierBlocks: [event.NumTiers]int32{event.TierCPU: 2, event.TierDisk: 1},
		// per tier on its own: CPU holds all three, disk misses block 1
		TierRuns: [event.NumTiers]int32{event.TierCPU: 3, event.TierDisk: 1}}}
	if !samePodScores(res.Pods, want) {
		t.Fatalf("got %+v\nwant %+v", res.Pods, want)
	}
	// the same with pods 2 and 3 as candidates: their bad-tier holders at
	// block 0 do not start a run
	if err := s.Score(ctx, 0, []blockkeys.Key{1, 2, 3}, []PodID{2, 3}, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Pods) != 0 {
		t.Fatalf("bad-tier holders scored: %+v", res.Pods)
	}

	// Fused and generic agree under equal weights on a real index, tiers
	// included.
	mem := NewMemoryIndex(MemoryConfig{})
	for p := PodID(0); p < 4; p++ {
		for tier := event.Tier(0); tier < event.NumTiers; tier++ {
			if (int(p)+int(tier))%2 == 0 || tier == event.TierExternal {
				_ = mem.Add(ctx, 0, p, tier, []blockkeys.Key{1, 2, 3, 4, 5}[:2+int(p)])
			}
		}
	}
	flat := TierWeights{1, 1, 1, 1}
	var fused, generic ScoreResult
	if err := NewScorer(mem, mem, flat).Score(ctx, 0, []blockkeys.Key{1, 2, 3, 4, 5}, nil, &fused); err != nil {
		t.Fatal(err)
	}
	if err := NewScorer(visitorOnly{mem}, nil, flat).Score(ctx, 0, []blockkeys.Key{1, 2, 3, 4, 5}, nil, &generic); err != nil {
		t.Fatal(err)
	}
	if !samePodScores(fused.Pods, generic.Pods) || len(fused.Pods) != 4 {
		t.Fatalf("equal weights:\n fused   %+v\n generic %+v", fused.Pods, generic.Pods)
	}
	for _, ps := range fused.Pods {
		for tier := event.Tier(0); tier < event.NumTiers; tier++ {
			if (int(ps.Pod)+int(tier))%2 == 0 || tier == event.TierExternal {
				// the lowest tier the pod holds gets every block
				if ps.TierBlocks[tier] != int32(ps.MatchedBlocks) {
					t.Errorf("pod %d: tiers %v, want all %d blocks on %s", ps.Pod, ps.TierBlocks, ps.MatchedBlocks, tier)
				}
				break
			}
		}
	}
}

// A candidate id just past the last possible pod cannot match and must not
// index the per-pod tables (it would be past their end).
func TestScorePrefixCandidateBeyondMaxPods(t *testing.T) {
	ctx := context.Background()
	idx := NewMemoryIndex(MemoryConfig{})
	keys := []blockkeys.Key{11, 12}
	if err := idx.Add(ctx, 0, 1, event.TierGPU, keys); err != nil {
		t.Fatal(err)
	}
	for _, cands := range [][]PodID{{MaxPods, 1}, {1, MaxPods}, {MaxPods}} {
		var res ScoreResult
		if err := idx.ScorePrefix(ctx, 0, keys, cands, DefaultTierWeights(), &res); err != nil {
			t.Fatal(err)
		}
		want := 0
		for _, p := range cands {
			if p == 1 {
				want = 1
			}
		}
		if len(res.Pods) != want {
			t.Fatalf("candidates %v: scores %+v", cands, res.Pods)
		}
		if want == 1 && (res.Pods[0].Pod != 1 || res.Pods[0].MatchedBlocks != 2) {
			t.Fatalf("candidates %v: scores %+v, want pod 1 with 2 blocks", cands, res.Pods)
		}
	}
}

// Under equal weights a block held on several tiers is credited to the
// first tier in holder order, and a pod's tier can change mid-run: the fused
// path's recount (a holder added at block 2) must agree with the generic
// path block by block, not keep the tier the run started on.
func TestScorePrefixEqualWeightTierChangeMidRun(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryIndex(MemoryConfig{})
	keys := []blockkeys.Key{1, 2, 3, 4}
	if err := mem.Add(ctx, 0, 0, event.TierCPU, keys); err != nil {
		t.Fatal(err)
	}
	if err := mem.Add(ctx, 0, 0, event.TierGPU, keys[2:]); err != nil {
		t.Fatal(err)
	}
	if err := mem.Add(ctx, 0, 1, event.TierGPU, keys); err != nil { // keeps blocks in chunks
		t.Fatal(err)
	}
	flat := TierWeights{1, 1, 1, 1}
	var fused, generic ScoreResult
	if err := NewScorer(mem, mem, flat).Score(ctx, 0, keys, nil, &fused); err != nil {
		t.Fatal(err)
	}
	if err := NewScorer(visitorOnly{mem}, nil, flat).Score(ctx, 0, keys, nil, &generic); err != nil {
		t.Fatal(err)
	}
	if !samePodScores(fused.Pods, generic.Pods) {
		t.Fatalf("fused %+v\ngeneric %+v", fused.Pods, generic.Pods)
	}
	for _, ps := range fused.Pods {
		if ps.Pod == 0 && (ps.TierBlocks[event.TierCPU] != 2 || ps.TierBlocks[event.TierGPU] != 2) {
			t.Fatalf("pod 0: tiers %v, want 2 blocks on CPU then 2 on GPU", ps.TierBlocks)
		}
	}
}

// With a candidate filter the per-pod table only reaches the candidates;
// a non-candidate holder with the next id, whose holding changes along the
// walk, must not be looked up past the table's end.
func TestScorePrefixNonCandidateJustPastTable(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryIndex(MemoryConfig{})
	keys := []blockkeys.Key{1, 2, 3}
	const beyond = 64 // the per-pod table of a fresh index grows to 64 entries at first
	if err := mem.Add(ctx, 0, 0, event.TierGPU, keys); err != nil {
		t.Fatal(err)
	}
	if err := mem.Add(ctx, 0, 5, event.TierGPU, keys); err != nil {
		t.Fatal(err)
	}
	if err := mem.Add(ctx, 0, beyond, event.TierGPU, keys[:1]); err != nil {
		t.Fatal(err)
	}
	var res ScoreResult
	if err := mem.ScorePrefix(ctx, 0, keys, []PodID{0}, DefaultTierWeights(), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Pods) != 1 || res.Pods[0].Pod != 0 || res.Pods[0].MatchedBlocks != 3 {
		t.Fatalf("scores %+v, want pod 0 with 3 blocks", res.Pods)
	}
}

// A generic-path call that visits no block (the first key is held by no
// one) after one whose walk ended with pods still extending: the pooled
// per-call state must not carry the earlier call's end of walk over.
func TestScorerGenericCallVisitingNothingAfterFullMatch(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryIndex(MemoryConfig{})
	if err := mem.Add(ctx, 0, 3, event.TierGPU, []blockkeys.Key{1, 2}); err != nil {
		t.Fatal(err)
	}
	s := NewScorer(visitorOnly{mem}, nil, DefaultTierWeights())
	var res ScoreResult
	for range 20 { // the pool may hand out a fresh state now and then
		if err := s.Score(ctx, 0, []blockkeys.Key{1, 2}, nil, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Pods) != 1 || res.Pods[0].MatchedBlocks != 2 {
			t.Fatalf("full match: %+v", res.Pods)
		}
		if err := s.Score(ctx, 0, []blockkeys.Key{9, 1}, nil, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Pods) != 0 {
			t.Fatalf("no block 0 holder, yet scores %+v", res.Pods)
		}
	}
}

// A candidate id at MaxPods cannot be indexed, so the generic path skips it
// before sizing its per-pod table by it: one stray id must not cost a table
// of 2^24 entries (hundreds of MB) per pooled state.
func TestScorerGenericCandidateAtMaxPodsAllocatesNoTable(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryIndex(MemoryConfig{})
	if err := mem.Add(ctx, 0, 1, event.TierGPU, []blockkeys.Key{1}); err != nil {
		t.Fatal(err)
	}
	s := NewScorer(visitorOnly{mem}, nil, DefaultTierWeights())
	var res ScoreResult
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := s.Score(ctx, 0, []blockkeys.Key{1}, []PodID{MaxPods, 1}, &res); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if len(res.Pods) != 1 || res.Pods[0].Pod != 1 {
		t.Fatalf("scores %+v, want pod 1 only", res.Pods)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("one call with candidate MaxPods allocated %d MB", grew>>20)
	}
}

// A pod id past the per-pod table's first size (64) grows it to hold that
// id, on both scoring paths and on a fresh pooled state.
func TestScoreHighPodIDOnFreshState(t *testing.T) {
	ctx := context.Background()
	for _, p := range []PodID{64, 100, 1000} {
		mem := NewMemoryIndex(MemoryConfig{})
		if err := mem.Add(ctx, 0, p, event.TierGPU, []blockkeys.Key{1, 2}); err != nil {
			t.Fatal(err)
		}
		for _, sc := range []*Scorer{NewScorer(mem, mem, DefaultTierWeights()), NewScorer(visitorOnly{mem}, nil, DefaultTierWeights())} {
			var res ScoreResult
			if err := sc.Score(ctx, 0, []blockkeys.Key{1, 2}, nil, &res); err != nil {
				t.Fatal(err)
			}
			if len(res.Pods) != 1 || res.Pods[0].Pod != p || res.Pods[0].MatchedBlocks != 2 {
				t.Fatalf("pod %d (prefix path %v): scores %+v", p, sc.prefix != nil, res.Pods)
			}
		}
	}
}
